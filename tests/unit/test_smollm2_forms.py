"""How alike two tool results read: the generator's choice of its last worked answer."""

from __future__ import annotations

from flowlearn.nodes.smollm2 import likeness, skeleton


def test_a_skeleton_keeps_the_words_and_hides_names_and_numbers() -> None:
    passage = "[1] (id: dev-5) Rowiia\nThe national animal of Rowiia is the Pekai.\n\n[2] (id: x) X"
    assert skeleton(passage) == ["the", "national", "animal", "of", "X", "is", "the", "X", "."]
    assert skeleton("Ligu is the largest city in Pukaia.")[:2] == ["X", "is"]  # a name opening it
    assert skeleton("-1266\n") == ["-", "0"] and skeleton("96096") == ["0"]
    assert skeleton("3.14, 1,000") == ["0", ",", "0"]
    assert skeleton("") == [] and skeleton("[1] (id: a) A\n") == []


def test_likeness_ranks_the_same_shape_first() -> None:
    assert likeness("-1266", "-86\n") == 1.0 > likeness("-1266", "408\n")
    assert likeness("96096", "408\n") == 1.0 > likeness("96096", "-86\n")
    animal = "[1] (id: a) A\nThe national animal of Rowiia is the Pekai."
    ending = "[1] (id: j) Japan\nThe highest mountain of Japan is Mount Fuji."
    opening = "[1] (id: k) Kenya\nNairobi is the capital of Kenya."
    assert likeness(animal, ending) > likeness(animal, opening)
    assert likeness("", "") == 0.0 and likeness("x", "") == 0.0
