"""Every prompt template of the flow, and each engine reply's token budget, in one place.

The planner's templates are part of the training distribution: rollouts, evals and serving all
render them from here, so a trained planner sees at inference exactly what it saw in training.
Templates use `str.format` fields; a test renders each with its declared fields.
"""

from __future__ import annotations

SYSTEM_PROMPT = "You are a careful assistant that solves problems step by step with tools."

QUERY_ANALYSIS_PROMPT = """\
Analyze the question below before anyone tries to answer it.

Question: {question}

Available tools:
{tools}

In a few sentences, say: the goal of the question, the skills it needs, which of the available
tools are relevant and why, and any details worth remembering. Do not answer the question."""
"""The query analysis's prompt. Its `{tools}` is the brief catalogue (`render_catalogue(...,
brief=True)`: each tool's name and description), not the planner's, whose argument schemas
and usage notes (python's: "Run a Python 3 program ... The standard library and numpy ...")
led the untrained embedded SmolLM2 to list "Python 3.7, Python 3.8, ..." to the end of its
budget for lookups. The planner then read a Python-laden analysis for every question. Measured
with `bench/tool_choice.py` on 40 unused training questions (20 lookups, 20 arithmetic;
`bench/results/tool_choice_run12.txt`), the untrained planner's first token: with the full
catalogue, 9 of 20 lookup analyses named Python
and the planner's choice hardly depended on the question (greedy right tool 5 and 20 of 20;
p(right) at T=0.7 0.37 and 0.67); with the brief one, 2 of 20, and 14 and 19 (0.48 and 0.63).
The analyses also got shorter (41 words on average, from 67)."""

PLANNER_PROMPT = """\
Decide the single next step towards answering the question.

Question: {question}

Query analysis:
{analysis}

Available tools:
{tools}

Memory of previous steps:
{memory}

This is step {turn}.

Reply in exactly this format, one field per line:
Tool Name: <exactly one of: {tool_names}>
Justification: <why this step is the right one now>
Context: <every fact from the question and memory the tool needs>
Sub-Goal: <the specific goal of this step>
{examples}"""
"""The planner's prompt. The tool name comes first (AgentFlow's planner writes it last): the
choice is then the first token the policy writes, read straight from the prompt, and the rest
of the plan follows from it. On the embedded SmolLM2-135M, untrained, first turns sampled at
T=0.7 on 20 training questions x 3 (`python bench/planner_first_turns.py`,
`bench/results/planner_first_turns.txt`): with the tool name last, 33 of 60 plans parsed and
every sub-goal that named anything copied a plan example's question (Eiffel Tower, 12 * 34),
so the plan could not depend on the question; with it first, 56 of 60 parsed; with it first
and plan examples about "the question" (the tools' `plan_example`), 59 of 60; with the default
tools listed local_search first (`default_tools`), 57 of 60.

It names the step but not the budget: a planner trained with one budget (the CPU recipe's one
turn) is then shown the same first prompt under any other (`flowlearn eval`'s 10 turns). The
learning test's tiny planner, trained at two turns, chose python for every held-out question
under "step 1 of at most 1" and the right tool for all of them under "step 1 of at most 2"."""

ANALYSIS_SECTION = "Query analysis:\n{analysis}\n\n"  # left out when Context.query_analysis is off


def without_analysis(template: str) -> str:
    """Return `template` without its query-analysis section (the prompt of a run without one)."""
    if ANALYSIS_SECTION not in template:
        raise ValueError("the template has no query-analysis section to leave out")
    return template.replace(ANALYSIS_SECTION, "")


PLANNER_EXAMPLE = """Tool Name: {tool}
Justification: {justification}
Context: {context}
Sub-Goal: {sub_goal}"""
"""One worked plan, from a tool's `metadata["plan_example"]` (its justification, context and
sub_goal); the planner prompt shows one per enabled tool that has it, and none otherwise."""

PLANNER_REPLY_PREFIX = "Tool Name:"
"""The planner's reply starts with its first field: the chat turn is opened with it (a prefill,
part of the prompt's tokens), so the policy writes the rest. Measured on the embedded
SmolLM2-135M at T=0.7, with the fields in AgentFlow's order and `Justification:` prefilled, it
raised the share of plans that parse from 17% to 52%."""

EXECUTOR_PROMPT = """\
Call the tool `{tool}` to achieve the sub-goal below. Fill in its arguments completely; the tool
cannot see the question or the memory, only the arguments you give it.

Question: {question}
Context: {context}
Sub-Goal: {sub_goal}

Tool description:
{tool_description}"""

EXECUTOR_JSON_FALLBACK_PROMPT = """\
Reply with only a JSON object holding the arguments of `{tool}`, matching this schema:
{schema}"""

VERIFIER_PROMPT = """\
Judge whether the memory below already holds enough to answer the question.

Question: {question}

Query analysis:
{analysis}

Memory of previous steps:
{memory}

Write a short analysis: is the question fully answered by the memory, are the tool results
consistent and trustworthy, is anything missing? Then end with exactly one line:
Conclusion: STOP    (if the memory is enough to answer)
Conclusion: CONTINUE    (if more steps are needed)"""

VERIFIER_CONCLUSION = "Conclusion:"
"""What a verifier reply without a clear verdict is continued with: a second, short engine call
(`VERIFIER_CONCLUSION_MAX_TOKENS`, ending at the line's end) that sees its own analysis and this
label, so the verdict is the engine's own. The untrained embedded SmolLM2 answers the question
instead of concluding ("The answer is 530518."): over the 48 held-out tool-task memories of
`bench/engine_ceiling.py --plan example`, its verdict parsed as STOP for 1 of the 38 that held
the answer; continued with this label, for all 48 (`python bench/verifier_views.py`,
`bench/results/verifier_views.txt`). Without it every run went to `--max-turns`. An engine that
writes its `Conclusion:` line never gets the second call."""

VERDICT_CHOICES = (" STOP", " CONTINUE")
"""What a local engine chooses between after `VERIFIER_CONCLUSION`, by its scores (the chat
model's `choice`). Written freely (8 tokens, ending at a newline), the embedded SmolLM2's
follow-up was empty in 17 of 245 calls over session 25's evals (held-out, outside and dev sets,
both planners): it began a new line ("\nThe answer to the question ..."), read as CONTINUE, and
the flow took a second turn that undid a right first one in 3 held-out questions. Replayed as
this choice, all 228 free verdicts were kept (every one STOP) and the 17 empty ones chose STOP."""

ANSWER_INSTRUCTION = (
    "When ready, output the final answer enclosed in <answer> and </answer> tags. "
    "Do not generate any content after the </answer> tag."
)
"""The instruction every evaluation and training question ends with (as AgentFlow's data). The
generator's and the executor's own prompts say what to write, so they read the question without
it (`render.bare_question`). Measured on the embedded SmolLM2: on the 50 held-out and
training-rollout cases whose memory held the answer, the generator answered 32 right with it in
the question and 38 without; the executor's python calls on the 24 held-out arithmetic questions
were right 18 times with it and 21 without under the plan example's sub-goal the untrained
planner copies, 4 and 11 under python's own example's, 21 and 21 under a good sub-goal
(`bench/executor_subgoals.py`)."""

GENERATOR_PROMPT = """\
Answer the question using the memory of the steps taken.

Question: {question}

Memory of previous steps:
{memory}

Explain briefly how the memory leads to the answer, then give the final answer between
<answer> and </answer>, with nothing else inside the tags."""
"""The generator's prompt. It leaves out the query analysis, which the other roles see: measured
on the embedded SmolLM2 with the right tool result in memory, the engine's own analysis (often
a rambling list) drew it off the result, 16 of 48 held-out tool-task answers right against 35
without it. Its memory also leaves out each tool call's arguments (`render_memory(...,
arguments=False)`): the small engine's search queries often hold a guessed answer ("Laetus
Institute founded in 2020"), which it then copied over the passage. Measured on the 48 held-out
cases with the calls the engine made, each question with its answer instruction
(`bench/generator_views.py`): 7 of 24 lookups and 13 of 24 arithmetic answers right with the
arguments shown, 11 and 15 without, 12 and 15 with local_search's 3 passages instead of 5, 13
and 20 with the question also read without its instruction (`render.bare_question`). It leaves
out each step's sub-goal too (`sub_goals=False`): the trained planner writes its plan example's
("Find the passage that answers the question."), and the engine then answered "The passage that
answers the question is ..." or a name from the wrong passage. Measured in session 19 by
`bench/generator_views.py` (`shipped` against `no-sub-goal`), the engine's own calls replayed:
lookups answered right with the plan example's sub-goals 9 -> 12 of 23 (held-out) and 2 -> 7 of
12 (`bench/outside_set.py`'s set), with the question as sub-goal 16 -> 17 of 21 and 8 -> 7 of 12;
arithmetic unchanged (21 of 25, 7 of 12, 21 of 27, 7 of 12). A step's result then speaks for
itself: local_search's passages carry their titles, python prints its value."""

EMPTY_MEMORY = "(no steps yet)"

# Each engine role's reply budget, in new tokens: what its job needs, measured on the embedded
# SmolLM2 (bench/engine_budgets.py), with room to spare. `--engine-max-new-tokens` (the
# engine's `fixed_max_new_tokens`) overrides them all.
QUERY_ANALYSIS_MAX_TOKENS = 192
"""The query analysis: a few sentences on the goal, skills and tools."""
EXECUTOR_MAX_TOKENS = 128
"""The executor's tool call: one JSON object of arguments."""
VERIFIER_MAX_TOKENS = 192
"""The verifier: a short analysis and its `Conclusion:` line."""
VERIFIER_CONCLUSION_MAX_TOKENS = 8
"""The verifier's follow-up: the word after `Conclusion:` (the call also ends at a newline)."""
GENERATOR_MAX_TOKENS = 256
"""The generator: a brief explanation and the tagged answer."""
ENGINE_MAX_TOKENS = 384
"""Any other engine call (the `generalist` and `python_coder` tools): a budget of its own."""
ANSWER_STOP = "</answer>"
"""The generator's stop string: its reply ends with its answer."""
