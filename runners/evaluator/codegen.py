"""Code generators: a bounded one for plain rendering, and a tracing one for byte provenance.

BoundedCodeGenerator changes three things, none of which changes a result: `~` concatenation calls
environment.checked_str_join instead of jinja2.runtime.str_join, output expressions are converted by
environment.checked_str instead of str (both check the deadline and the value size first), and every node
visited while compiling checks the compile deadline.

TracingCodeGenerator additionally tags every emitted chunk with (template line, construct): each child of an
Output node becomes `environment.trace_out(value, lineno, construct)` / `environment.trace_const(...)`, call
blocks and filter blocks are tagged as statements, and `~` keeps the provenance of its operands. The tags
travel on a str subclass (runners.evaluator.tracing.Traced) so that text built inside macros, call blocks
and block sets keeps the lines that produced it when the caller finally outputs it.
"""
from __future__ import annotations

from jinja2 import nodes
from jinja2.compiler import CodeGenerator, optimizeconst

from .environment import active_budget

KNOWN_GLOBALS = frozenset({"raise_exception", "strftime_now", "range", "namespace", "dict", "lipsum",
                           "cycler", "joiner"})

_BINOP_NAMES = {
    nodes.Add: "op:add", nodes.Sub: "op:sub", nodes.Mul: "op:mul", nodes.Div: "op:div",
    nodes.FloorDiv: "op:floordiv", nodes.Mod: "op:mod", nodes.Pow: "op:pow", nodes.And: "op:and",
    nodes.Or: "op:or", nodes.Not: "op:not", nodes.Neg: "op:neg", nodes.Pos: "op:pos",
}


def expression_construct(node: nodes.Node) -> str:
    """The construct name of the outermost node of an output expression (names as in constructs.json)."""
    if isinstance(node, nodes.Filter):
        return f"filter:{node.name}"
    if isinstance(node, nodes.Test):
        return f"test:{node.name}"
    if isinstance(node, nodes.Call):
        target = node.node
        if isinstance(target, nodes.Getattr):
            return f"method:{target.attr}"
        if isinstance(target, nodes.Name):
            if target.name in KNOWN_GLOBALS:
                return f"global:{target.name}"
            if target.name == "caller":
                return "call:caller"
            if target.name == "loop":
                return "loop:call"
            return "call:macro"
        return "call:other"
    if isinstance(node, nodes.Concat):
        return "op:concat"
    if isinstance(node, nodes.CondExpr):
        return "op:ternary"
    if isinstance(node, nodes.Getattr):
        if isinstance(node.node, nodes.Name) and node.node.name == "loop":
            return f"loop:{node.attr}"
        return "op:attr"
    if isinstance(node, nodes.Getitem):
        return "op:slice" if isinstance(node.arg, nodes.Slice) else "op:subscript"
    if isinstance(node, nodes.Compare):
        return "op:compare"
    for cls, name in _BINOP_NAMES.items():
        if isinstance(node, cls):
            return name
    if isinstance(node, nodes.Name):
        return "expr:variable"
    if isinstance(node, (nodes.Const, nodes.TemplateData)):
        return "expr:literal"
    if isinstance(node, (nodes.List, nodes.Tuple, nodes.Dict)):
        return "expr:literal"
    return f"expr:{type(node).__name__.lower()}"


class BoundedCodeGenerator(CodeGenerator):
    def visit(self, node, *args, **kwargs):
        budget = active_budget()
        if budget is not None:
            budget.check()  # compiling a huge template ends at the compile time limit
        return super().visit(node, *args, **kwargs)

    def _output_child_pre(self, node, frame, finalize) -> None:
        # str() of a container with shared items can be gigabytes: the environment checks the size first.
        if frame.eval_ctx.volatile:
            self.write("(environment.checked_escape if context.eval_ctx.autoescape else environment.checked_str)(")
        elif frame.eval_ctx.autoescape:
            self.write("environment.checked_escape(")
        else:
            self.write("environment.checked_str(")
        if finalize.src is not None:
            self.write(finalize.src)

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame) -> None:
        self.write("environment.checked_str_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class TracingCodeGenerator(BoundedCodeGenerator):
    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame) -> None:
        self.write("environment.traced_str_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write(f"), {node.lineno!r})")

    def visit_Output(self, node: nodes.Output, frame) -> None:
        if frame.require_output_check:
            if self.has_known_extends:
                return
            self.writeline("if parent_template is None:")
            self.indent()
        if frame.eval_ctx.autoescape or self.environment.finalize:
            raise NotImplementedError("tracing supports the chat-template environment only (no autoescape)")
        finalize = self._make_finalize()
        for child in node.nodes:
            try:
                const = self._output_child_to_const(child, frame, finalize)
            except (nodes.Impossible, Exception):
                const = None
                runtime = True
            else:
                runtime = False
            construct = "text:data" if isinstance(child, nodes.TemplateData) else expression_construct(child)
            if frame.buffer is None:
                self.writeline("yield ", child)
            else:
                self.writeline(f"{frame.buffer}.append(", child)
            if runtime:
                self.write("environment.trace_out(")
                self.visit(child, frame)
                self.write(f", {child.lineno!r}, {construct!r})")
            else:
                self.write(f"environment.trace_const({const!r}, {child.lineno!r}, {construct!r})")
            if frame.buffer is not None:
                self.write(")")
        if frame.require_output_check:
            self.outdent()

    def visit_CallBlock(self, node: nodes.CallBlock, frame) -> None:
        call_frame, macro_ref = self.macro_body(node, frame)
        self.writeline("caller = ")
        self.macro_def(macro_ref, call_frame)
        construct = "stmt:generation" if isinstance(node.call.node, nodes.ExtensionAttribute) else "stmt:call"
        self.start_write(frame, node)
        self.write("environment.trace_out(")
        self.visit_Call(node.call, frame, forward_caller=True)
        self.write(f", {node.lineno!r}, {construct!r})")
        self.end_write(frame)

    def visit_FilterBlock(self, node: nodes.FilterBlock, frame) -> None:
        filter_frame = frame.inner()
        filter_frame.symbols.analyze_node(node)
        self.enter_frame(filter_frame)
        self.buffer(filter_frame)
        self.blockvisit(node.body, filter_frame)
        self.start_write(frame, node)
        self.write("environment.trace_out(")
        self.visit_Filter(node.filter, filter_frame)
        self.write(f", {node.lineno!r}, 'stmt:filter')")
        self.end_write(frame)
        self.leave_frame(filter_frame)
