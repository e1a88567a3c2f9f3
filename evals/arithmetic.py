"""Safe evaluation of Game-of-24 expressions: parsed with `ast`, never `eval`'d."""

from __future__ import annotations

import ast
from fractions import Fraction

from flowlearn.errors import FlowlearnError

_SYMBOLS = str.maketrans({"×": "*", "÷": "/", "x": "*", "X": "*", "−": "-", "–": "-", "·": "*"})
_MAX_CHARS = 200


class ExpressionError(FlowlearnError, ValueError):
    """The text is not a plain arithmetic expression over numbers with + - * / and brackets."""


def parse_expression(text: str) -> ast.expr:
    """Parse `text` into an arithmetic AST, rejecting everything but numbers and + - * /."""
    cleaned = text.strip().translate(_SYMBOLS).replace("[", "(").replace("]", ")")
    cleaned = cleaned.split("=")[0].strip()  # "(1+1+1)*8 = 24" -> left side
    if not cleaned or len(cleaned) > _MAX_CHARS:
        raise ExpressionError(f"expected an expression of 1 to {_MAX_CHARS} characters")
    try:
        tree = ast.parse(cleaned, mode="eval").body
    except SyntaxError as exc:
        raise ExpressionError(f"not an arithmetic expression: {cleaned!r}") from exc
    for node in ast.walk(tree):
        if not isinstance(
            node,
            ast.BinOp
            | ast.UnaryOp
            | ast.Constant
            | ast.Add
            | ast.Sub
            | ast.Mult
            | ast.Div
            | ast.USub
            | ast.UAdd,
        ):
            raise ExpressionError(f"{type(node).__name__} is not allowed; use numbers and + - * /")
        if isinstance(node, ast.Constant):
            _number(node)
    return tree


def evaluate(tree: ast.expr) -> Fraction:
    """Evaluate a parsed expression exactly with fractions.

    Raises:
        ZeroDivisionError: a division by zero.

    """
    if isinstance(tree, ast.Constant):
        return Fraction(_number(tree))
    if isinstance(tree, ast.UnaryOp):
        value = evaluate(tree.operand)
        return -value if isinstance(tree.op, ast.USub) else value
    assert isinstance(tree, ast.BinOp)
    left, right = evaluate(tree.left), evaluate(tree.right)
    if isinstance(tree.op, ast.Add):
        return left + right
    if isinstance(tree.op, ast.Sub):
        return left - right
    if isinstance(tree.op, ast.Mult):
        return left * right
    return left / right


def numbers_used(tree: ast.expr) -> list[Fraction]:
    """Return the numeric literals of the expression, sorted."""
    return sorted(Fraction(_number(n)) for n in ast.walk(tree) if isinstance(n, ast.Constant))


def _number(node: ast.Constant) -> int | float:
    value = node.value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ExpressionError(f"{value!r} is not a number")
    return value
