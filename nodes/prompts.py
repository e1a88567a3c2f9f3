"""Every prompt of the flow as data: AgentFlow's own templates, and the `Prompts` set nodes take.

A node factory takes a `Prompts` (`make_planner(policy, tools, prompts=AGENTFLOW_PROMPTS)`), so
a user swaps a template without writing a node: `dataclasses.replace(AGENTFLOW_PROMPTS,
planner=MY_PLANNER_PROMPT)`. The planner's template is part of the training distribution:
rollouts, evals and serving render it from the same `Prompts`, so a trained planner sees at
inference exactly what it saw in training. Templates use `str.format` fields; each role's
fields are declared in `FIELDS`, and a set with an unknown field is refused when it is built.

The defaults follow AgentFlow's prompts (arXiv 2510.05592, its official code) in structure and
wording. Where they depart, the line says why:
- Tool calls are JSON arguments (structured output), not Python written to be `exec`'d.
- The verifier's verdict is stored in memory (the official code computes it and forgets it),
  and a reply with no `Conclusion:` line is continued once after that label, so the verdict
  is the engine's own rather than a guess from a stray "stop" in its text.
- The generator puts its answer between `<answer>` tags, which the scorers read (AgentFlow's
  benchmark questions carry that instruction; a question typed at `flowlearn run` does not).
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from flowlearn.nodes.schema.context import Context
from flowlearn.nodes.schema.records import StepRecord

Example = tuple[str, Sequence[StepRecord], str]
"""A worked answer for the generator: a question, its memory and the reply wanted."""

SYSTEM_PROMPT = "You are a careful assistant that solves problems step by step with tools."

QUERY_ANALYSIS_PROMPT = """\
Task: Analyze the given query to determine necessary skills and tools.

Inputs:
- Query: {question}
- Available tools:
{tools}

Instructions:
1. Identify the main objectives in the query.
2. List the necessary skills and tools.
3. For each skill and tool, explain how it helps address the query.
4. Note any additional considerations.

Format your response with a summary of the query, lists of skills and tools with explanations, \
and a section for additional considerations.

Be brief and precise with insight."""

PLANNER_ANALYSIS = "- **Query Analysis:** {analysis}\n"
"""The planner's and verifier's query-analysis line, left out of a run without an analysis."""

PLANNER_PROMPT = """\
Task: Determine the optimal next step to address the query using available tools and previous \
steps.

Context:
- **Query:** {question}
- **Query Analysis:** {analysis}
- **Available Tools:** {tool_names}
- **Toolbox Metadata:**
{tools}
- **Previous Steps:**
{memory}
- **Current Step:** {turn} of at most {max_turns}

Instructions:
1. Analyze the query, previous steps, and available tools.
2. Select the **single best tool** for the next step.
3. Formulate a specific, achievable **sub-goal** for that tool.
4. Provide all necessary **context** (data, file names, variables) for the tool to function.

Response Format:
1.  **Justification:** Explain your choice of tool and sub-goal.
2.  **Context:** Provide all necessary information for the tool.
3.  **Sub-Goal:** State the specific objective for the tool.
4.  **Tool Name:** State the exact name of the selected tool.

Rules:
- Select only ONE tool.
- The sub-goal must be directly achievable by the selected tool.
- The Context section must contain all information the tool needs to function.
- The response must end with the Context, Sub-Goal, and Tool Name sections in that order, with \
no extra content.
{examples}"""
"""The planner's prompt, AgentFlow's text-only wording. It also names the step and the budget
(AgentFlow's multimodal planner does), so a planner knows how many turns remain."""

PLAN_EXAMPLE = """\
Justification: {justification}
Context: {context}
Sub-Goal: {sub_goal}
Tool Name: {tool}"""
"""One worked plan, rendered into the planner's `{examples}` for a tool that has one (a
`Prompts.plan_examples` entry or the tool's `metadata["plan_example"]`)."""

EXECUTOR_PROMPT = """\
Task: Generate the arguments of one call of the selected tool to achieve the sub-goal.

Context:
- **Query:** {question}
- **Sub-Goal:** {sub_goal}
- **Tool Name:** {tool}
- **Tool Metadata:**
{tool_description}
- **Relevant Data:** {context}

Instructions:
1. Analyze the tool's required parameters from its metadata.
2. Construct valid arguments that address the sub-goal using the context.
3. Fill in every argument completely: the tool sees only its arguments, not the query or \
the memory."""
"""The executor's prompt. AgentFlow asks for Python that calls the tool; here the engine fills
in the tool's JSON arguments (tool calling), which nothing executes as code."""

EXECUTOR_JSON_FALLBACK_PROMPT = """\
Reply with only a JSON object holding the arguments of `{tool}`, matching this schema:
{schema}"""

VERIFIER_PROMPT = """\
Task: Evaluate if the current memory is complete and accurate enough to answer the query, or if \
more tools are needed.

Context:
- **Query:** {question}
- **Available Tools:**
{tools}
- **Initial Analysis:** {analysis}
- **Memory (Tools Used & Results):**
{memory}

Instructions:
1.  Review the query, initial analysis, and memory.
2.  Assess the completeness of the memory: Does it fully address all parts of the query?
3.  Check for potential issues:
    -   Are there any inconsistencies or contradictions?
    -   Is any information ambiguous or in need of verification?
4.  Determine if any unused tools could provide missing information.

Final Determination:
-   If the memory is sufficient, explain why and conclude with "STOP".
-   If more information is needed, explain what's missing, which tools could help, and \
conclude with "CONTINUE".

IMPORTANT: The response must end with either "Conclusion: STOP" or "Conclusion: CONTINUE"."""

VERIFIER_ANALYSIS = "- **Initial Analysis:** {analysis}\n"

GENERATOR_PROMPT = """\
Task: Generate a concise final answer to the query based on all provided context.

Context:
- **Query:** {question}
- **Initial Analysis:** {analysis}
- **Actions Taken:**
{memory}

Instructions:
1. Review the query and the results from all actions.
2. Synthesize the key findings into a clear, step-by-step summary of the process.
3. Provide a direct, precise answer to the original query.

Output Structure:
1.  **Process Summary:** A clear, step-by-step breakdown of how the query was addressed, \
including the purpose and key results of each action.
2.  **Answer:** A direct and concise final answer to the query, enclosed in <answer> and \
</answer> tags, with nothing else inside the tags."""

GENERATOR_ANALYSIS = "- **Initial Analysis:** {analysis}\n"

ANSWER_INSTRUCTION = (
    "When ready, output the final answer enclosed in <answer> and </answer> tags. "
    "Do not generate any content after the </answer> tag."
)
"""The instruction every evaluation and training question ends with, as in AgentFlow's data."""

EMPTY_MEMORY = "(no steps yet)"
ANSWER_STOP = "</answer>"
"""The generator's stop string: its reply ends with its answer."""
VERIFIER_CONCLUSION = "Conclusion:"
"""The label a verifier reply without a clear verdict is continued after (see the module)."""

FIELDS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "system": frozenset(),
        "query_analysis": frozenset({"question", "tools"}),
        "planner": frozenset(
            {"question", "analysis", "tools", "tool_names", "memory", "turn", "max_turns"}
            | {"examples"}
        ),
        "plan_example": frozenset({"tool", "justification", "context", "sub_goal"}),
        "executor": frozenset({"question", "context", "sub_goal", "tool", "tool_description"}),
        "executor_json_fallback": frozenset({"tool", "schema"}),
        "verifier": frozenset({"question", "analysis", "tools", "memory"}),
        "generator": frozenset({"question", "analysis", "memory"}),
    }
)
"""The fields each role's template may use; every one is given when the template is rendered."""


@dataclass(frozen=True, kw_only=True)
class Budgets:
    """Each fixed-engine role's reply budget, in new tokens.

    `--engine-max-new-tokens` (the engine's `fixed_max_new_tokens`) overrides them all.
    """

    query_analysis: int = 512
    executor: int = 512
    verifier: int = 512
    verifier_conclusion: int = 8
    """The verifier's follow-up: the word after `Conclusion:` (it also ends at a newline)."""
    generator: int = 1024
    engine: int = 1024
    """Any other engine call (the `generalist` and `python_coder` tools)."""

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"budget {name} must be a whole number >= 1, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class MemoryView:
    """What of memory and the question a role's prompt shows."""

    arguments: bool = True
    """Each tool call's arguments."""
    sub_goals: bool = True
    """Each step's sub-goal."""
    analysis: bool = True
    """The query analysis (when the run has one)."""
    bare_question: bool = False
    """The question without its trailing `ANSWER_INSTRUCTION`."""
    results: bool = False
    """The executor's view only: the results of the earlier tool calls follow the plan's
    context in the executor's prompt (AgentFlow's executor sees only the plan, so a planner
    must copy into its context what a later call needs; a small planner may not)."""


ExampleOrder = Callable[[Sequence[StepRecord], Sequence[Example]], list[Example]]
"""Order (and reword) the generator's worked answers for a memory: `(memory, examples)`."""


@dataclass(frozen=True, kw_only=True)
class Prompts:
    """The templates, worked examples and budgets of one flow: what the nodes say to models.

    `AGENTFLOW_PROMPTS` is the default; `flowlearn.nodes.smollm2.SMOLLM2_PROMPTS` is the set
    tuned for the embedded 135M model. Build your own with `dataclasses.replace`.
    """

    name: str = "custom"
    """A name for logs and run records."""
    system: str = SYSTEM_PROMPT
    query_analysis: str = QUERY_ANALYSIS_PROMPT
    analyze: bool = True
    """Whether a run analyses the question first when its `Context.query_analysis` is None."""
    brief_analysis_catalogue: bool = False
    """Show the query analysis only each tool's name and description, not its full entry."""
    planner: str = PLANNER_PROMPT
    planner_analysis: str = PLANNER_ANALYSIS
    """The planner template's analysis section, left out when the run has no analysis."""
    plan_example: str = PLAN_EXAMPLE
    plan_examples: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Worked plans by tool name (justification, context, sub_goal), shown in `{examples}`."""
    planner_reply_prefix: str | None = None
    """Open the planner's reply with this (a prefill) on a policy that continues one."""
    executor: str = EXECUTOR_PROMPT
    executor_json_fallback: str = EXECUTOR_JSON_FALLBACK_PROMPT
    executor_view: MemoryView = MemoryView(bare_question=False)
    call_examples: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    """Worked tool calls by tool name (question, context, sub_goal, arguments), shown to the
    executor as earlier chat turns; a tool's own `metadata["call_examples"]` comes first."""
    verifier: str = VERIFIER_PROMPT
    verifier_analysis: str = VERIFIER_ANALYSIS
    verifier_conclusion: str = VERIFIER_CONCLUSION
    verdict_choices: tuple[str, ...] = ()
    """When set, an engine that scores choices picks the follow-up verdict among these."""
    generator: str = GENERATOR_PROMPT
    generator_analysis: str = GENERATOR_ANALYSIS
    generator_view: MemoryView = MemoryView()
    generator_examples: Sequence[Example] = ()
    order_examples: ExampleOrder | None = None
    """How the generator's worked answers are ordered for a memory; None keeps their order."""
    budgets: Budgets = Budgets()
    tool_order: tuple[str, ...] = ()
    """The built-in tools' order in the prompts (named first, in this order; others after)."""
    search_k: int = 5
    """Passages `local_search` returns."""

    def __post_init__(self) -> None:
        for role, allowed in FIELDS.items():
            check_template(role, getattr(self, role), allowed)
        for role in ("planner", "verifier", "generator"):
            section = getattr(self, f"{role}_analysis")
            if section and section not in getattr(self, role):
                # a section that cannot be found would be left in a run without an analysis
                object.__setattr__(self, f"{role}_analysis", "")
        if self.search_k < 1:
            raise ValueError(f"search_k must be >= 1, got {self.search_k}")

    def template(self, role: str, *, analysis: bool) -> str:
        """Return a role's template, without its analysis section when `analysis` is off."""
        text: str = getattr(self, role)
        section = getattr(self, f"{role}_analysis", "")
        return text if analysis or not section else text.replace(section, "")


def check_template(role: str, template: object, allowed: frozenset[str]) -> None:
    """Refuse a template that is not a string or uses a field its role does not give.

    Raises:
        ValueError: naming the role, the unknown fields and the ones allowed.

    """
    if not isinstance(template, str):
        raise ValueError(f"the {role} prompt must be a string, got {type(template).__name__}")
    try:
        used = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise ValueError(f"the {role} prompt is not a valid str.format template: {exc}") from None
    unknown = sorted(used - allowed)
    if unknown:
        raise ValueError(
            f"the {role} prompt uses fields {unknown}, which that role does not give; "
            f"its fields are {sorted(allowed)} (write a literal brace as {{{{ or }}}})"
        )


AGENTFLOW_PROMPTS = Prompts(name="agentflow")
"""AgentFlow's flow: the paper's prompts and order, a query analysis, budgets for real models."""


PROMPTS_RECORD = "flowlearn_prompts.json"
"""The file in a trained model folder that names the prompt set it was trained under, and the
fixed engine it was trained against."""


def write_prompts_record(folder: Path, prompts: Prompts, *, engine: str | None = None) -> None:
    """Name, in a trained model's `folder`, its prompt set and (if local) its fixed engine."""
    record = {"prompts": prompts.name, **({"engine": engine} if engine else {})}
    (folder / PROMPTS_RECORD).write_text(json.dumps(record) + "\n")


def recorded_prompts(model: str) -> str | None:
    """Return the prompt set a local model folder says it was trained under, or None.

    Raises:
        ValueError: a record that is not one, naming the file.

    """
    return _recorded(model, "prompts", required=True)


def recorded_engine(model: str) -> str | None:
    """Return the fixed engine a local model folder says it was trained against, or None.

    Raises:
        ValueError: a record that is not one, naming the file.

    """
    return _recorded(model, "engine", required=False)


def _recorded(model: str, key: str, *, required: bool) -> str | None:
    path = Path(model).expanduser() / PROMPTS_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        value = record[key] if required else record.get(key)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} does not name a prompt set ({exc}); fix or remove it") from None
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{path} does not name a {key} (got {value!r}); fix or remove it")
    return value


def runs_analysis(context: Context, prompts: Prompts) -> bool:
    """Say whether a run analyses the question: its `query_analysis`, else the prompts' choice."""
    return prompts.analyze if context.query_analysis is None else context.query_analysis
