"""The generator's worked answers: earlier chat turns showing how to answer from a tool result.

The generator (`generator.generator_messages`) shows them before the question, those of the
memory's last tool last and, among those, the one whose result reads most like the memory's last
(`result_forms.likeness`).
"""

from __future__ import annotations

from flowlearn.nodes.schema.records import StepRecord

GENERATOR_EXAMPLES: tuple[tuple[str, list[StepRecord], str], ...] = (
    (
        "What is 12 * 34?",
        [
            {
                "turn": 1,
                "kind": "action",
                "tool": "python",
                "sub_goal": "Compute 12 * 34.",
                "arguments": {"code": "12 * 34"},
                "result": "408\n",
                "error": None,
            },
            {"turn": 1, "kind": "verification", "verdict": "STOP"},
        ],
        "The python tool printed 408. <answer>408</answer>",
    ),
    (
        "What is 34 - 120?",
        [
            {
                "turn": 1,
                "kind": "action",
                "tool": "python",
                "sub_goal": "Compute 34 - 120.",
                "arguments": {"code": "34 - 120"},
                "result": "-86\n",
                "error": None,
            },
            {"turn": 1, "kind": "verification", "verdict": "STOP"},
        ],
        "The python tool printed -86. <answer>-86</answer>",
    ),
    (
        "How long is the Kora Bridge, in metres?",
        [
            {
                "turn": 1,
                "kind": "action",
                "tool": "local_search",
                "sub_goal": "Find the length of the Kora Bridge.",
                "arguments": {"query": "Kora Bridge length"},
                "result": "[1] (id: kora-bridge) Kora Bridge\n"
                "The Kora Bridge is 412 metres long.\n\n"
                "[2] (id: tana-dam) Tana Dam\nThe Tana Dam is 96 metres high.",
                "error": None,
            },
            {"turn": 1, "kind": "verification", "verdict": "STOP"},
        ],
        "The first passage says the Kora Bridge is 412 metres long. <answer>412</answer>",
    ),
    (
        "Who wrote the novel The Glass Road?",
        [
            {
                "turn": 1,
                "kind": "action",
                "tool": "local_search",
                "sub_goal": "Find the author of The Glass Road.",
                "arguments": {"query": "The Glass Road novel author"},
                "result": "[1] (id: glass-road) The Glass Road\n"
                "The Glass Road is a novel written by Ana Petrov.\n\n"
                "[2] (id: red-hill) The Red Hill\nThe Red Hill is a novel written by Tom Berg.",
                "error": None,
            },
            {"turn": 1, "kind": "verification", "verdict": "STOP"},
        ],
        "The first passage says The Glass Road is a novel written by Ana Petrov. "
        "<answer>Ana Petrov</answer>",
    ),
    (
        "Who built the Tana Dam?",
        [
            {
                "turn": 1,
                "kind": "action",
                "tool": "local_search",
                "sub_goal": "Find the builder of the Tana Dam.",
                "arguments": {"query": "Tana Dam builder"},
                "result": "[1] (id: tana-dam) Tana Dam\n"
                "The Tana Dam was built by Lena Ost.\n\n"
                "[2] (id: kora-bridge) Kora Bridge\nThe Kora Bridge was built by Ivo Marn.",
                "error": None,
            },
            {"turn": 1, "kind": "verification", "verdict": "STOP"},
        ],
        "The first passage says the Tana Dam was built by Lena Ost. <answer>Lena Ost</answer>",
    ),
    (
        "What is the capital of Kenya?",
        [
            {
                "turn": 1,
                "kind": "action",
                "tool": "local_search",
                "sub_goal": "Find the capital of Kenya.",
                "arguments": {"query": "capital of Kenya"},
                "result": "[1] (id: kenya) Kenya\nNairobi is the capital of Kenya.\n\n"
                "[2] (id: peru) Peru\nLima is the capital of Peru.",
                "error": None,
            },
            {"turn": 1, "kind": "verification", "verdict": "STOP"},
        ],
        "The first passage says Nairobi is the capital of Kenya. <answer>Nairobi</answer>",
    ),
    (
        "What is the highest mountain of Japan?",
        [
            {
                "turn": 1,
                "kind": "action",
                "tool": "local_search",
                "sub_goal": "Find the highest mountain of Japan.",
                "arguments": {"query": "highest mountain of Japan"},
                "result": "[1] (id: japan) Japan\nThe highest mountain of Japan is Mount Fuji.\n\n"
                "[2] (id: chile) Chile\nThe highest mountain of Chile is Ojos del Salado.",
                "error": None,
            },
            {"turn": 1, "kind": "verification", "verdict": "STOP"},
        ],
        "The first passage says the highest mountain of Japan is Mount Fuji. "
        "<answer>Mount Fuji</answer>",
    ),
)
"""Worked answers shown to the generator as earlier chat turns (question, memory, reply): a number
python printed and a negative one, a quantity asked in its unit, two names that end their
passage ("is a novel written by", "was built by"), one that starts it and one that ends a "The R
of X is Y." sentence, each answered with only the answer in its tags. The generator shows the
examples of the tool its memory used last after the others, the one whose result reads most
like the memory's last (`generator.ordered_examples`): the embedded SmolLM2 copies the last
example's way of answering.

The Tana Dam's was added in session 26: with the author's alone nearest to every "by" passage,
the engine copied its "Ana Petrov" (inventors 8 of 12). With it, lookups right with the right
passages in memory: task 59 -> 62 of 72 (inventors 8 -> 12, rivers 10 -> 9), dev 15 -> 17 of
21 (heights 3 -> 2), outside 11 of 12 both (`bench/generator_examples.py --kinds lookup`, set
`session 25` against `shipped`); on 34 "by" lookups of the three sets joined 26 -> 31 (as the
bench set `two by`).

The negative python answer and the mountain's were added with that ordering in session 25.
Measured with the right tool result in memory (`bench/generator_examples.py`, sets `by tool`,
the four examples in the order of sessions 14-24, against `nearest`, these six by form),
right answers: dev set (`bench/outside_set.py --relations dev`) 24 -> 36 of 42 (negative
differences 1 -> 11 of 11: after python printed 408 the engine dropped the sign of -1266;
lookups 13 -> 15 of 21), outside set 21 -> 23 of 24, the task's train and held-out questions
132 -> 131 of 144 (inventors 11 -> 8 of 12: with the author's example last the engine copied
its "Ana Petrov"; capitals 5 -> 6, the one negative 0 -> 1); `bench/results/generator_examples.txt`.

Earlier measurements. The quantity's (session 20): without it the engine answered "159 metres"
to a depth asked in metres; with it, lookups right from the engine's replayed calls 12 -> 13 of
23 held-out (plan-example sub-goals), 17 -> 17 of 21 (question sub-goals) and 7 -> 8 of 12 on
`bench/outside_set.py`'s set, arithmetic unchanged (`bench/generator_views.py`, views
`no-sub-goal` and `quantity`). Session 14, on the 72 train and held-out lookups (the passages
their question finds) and 72 arithmetic questions (the right number printed): the python
example and Kenya's alone, 40 lookups and 71 arithmetic right (the author's name at the end of
its passage: 1 of 12); with the author's example before Kenya's, 57 and 72 in the order chosen
per tool, but 9 lookups when python's came last and 48 arithmetic when Kenya's did. Earlier
(the python and Kenya examples, in that order), with the right tool result in memory: 35 of 48
held-out tool-task answers exactly right with them, 12 without (it answered in sentences); a
year from a passage as a third example was copied into 11 answers. Python's replies only name
the printed number: when one restated the expression ("computed 12 * 34 and printed 408"), the
engine recomputed sums in its head: 18 of 24 arithmetic answers right against 20 with the
shorter reply."""

GENERATOR_ASKS = {
    "How long is the Kora Bridge, in metres?": "the length of the Kora Bridge",
    "Who wrote the novel The Glass Road?": "the author of The Glass Road",
    "Who built the Tana Dam?": "the builder of the Tana Dam",
    "What is the capital of Kenya?": "the capital of Kenya",
    "What is the highest mountain of Japan?": "the highest mountain of Japan",
}
"""What each worked lookup's question asks for: its reply opens with it ("The question asks for
the capital of Kenya. The first passage says ...") when the memory's last tool is
`local_search` (`generator.echoed`). Measured in session 21 with the right passages in memory
(`bench/generator_examples.py`, set `question echo`): lookups right 56 -> 61 of 72 (task), 12 ->
13 of 21 (`bench/outside_set.py --relations dev`), 7 -> 10 of 12 (the outside set)."""
