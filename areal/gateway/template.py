"""A model's chat template as the gateway renders it: messages -> prompt text, fast and as the servers do.

Rendering calls the tokenizer's compiled Jinja template directly with what ``apply_chat_template``
would pass it (None-valued keys dropped, reasoning aliases, plain data, the special-tokens map,
the request's ``chat_template_kwargs``), skipping its per-call wrapper; each message is prepared
once per turn for all of the turn's renders (``renderer``), and a tools list's template data is
kept between turns (agents send the same tools every turn; keyed by its order-preserving
encoding). The template is compiled in an overlay of transformers' sandboxed environment
(``compile_dict_first``) that answers ``message.role`` and ``loop.first`` without the sandbox's
exception path, with the sandbox's own answers. A probe conversation is rendered both ways at
construction, and any difference (another transformers version) falls back to
``apply_chat_template`` for good.

Messages go to the template as SGLang and vLLM hand them to it (``for_template``):
- a null ``content`` as "" (Qwen3's template tests ``'</think>' in message.content``);
- tool-call arguments as objects where the template takes objects (``arguments|items`` of
  Qwen3-Coder, ``arguments|tojson`` of Llama 3.1, DeepSeek and GPT-OSS), as text where it writes
  text verbatim (Qwen2.5's ``arguments if arguments is string``, and the embedded model's). A
  probe at construction decides (``argument_objects``): objects when text arguments fail to render
  or come out JSON-quoted.

A template that refuses the messages (``raise_exception``, a filter on the wrong type) makes
``render_text`` raise a 400 ``RequestError`` naming ``messages``; ``renderer`` lets the template's
error through for callers that fall back instead. ``check_template_kwargs`` refuses kwargs that
would collide with the render's own arguments.

Requests that offer tools render with ``gateway.tool_template`` when it is set (transformers'
rule for a tokenizer's "tool_use" template: chosen by ``tools`` alone), with the model's own
template otherwise; requests without tools always render with the model's own. It is for a
model whose template has no tool branch (SmolLM2-Instruct's is ChatML with a default system
prompt and nothing else): a built-in name (``TOOL_TEMPLATES``: ``chatml-tools``, tools as JSON
in the system turn, calls as ``<tool_call>`` JSON, results in a tool turn; the text is
``templates/chatml-tools.jinja``) or a ``.jinja`` file. Probes at construction say what the
template of each kind of request shows (``renders_tools``, ``renders_calls``), so that
``check_tools`` refuses, with a 400 naming the setting, a request its template would strip of
everything about tools without a word: tools given to a template with no tool branch (it writes
neither the tools nor an assistant's calls), or a history's tool calls the template drops. A
template that writes calls but not the tools is left as it is: DeepSeek-V3.1's expects the client
to describe its tools in the system prompt, and the request's ``tools`` still turn on parsing.

``renders_developer`` (per kind of request) says whether the template has a branch for the
``developer`` role (it names it, and a probe's developer text reaches the render); where it has
none, the core hands it developer messages as system ones rather than let it drop them.
``thinking_switch`` (per kind of request) names the keyword argument that turns its reasoning on
and off (``enable_thinking``, ``thinking``) or sets its effort (``reasoning_effort``), if any: the
core maps a request's reasoning effort onto it (``assistant_turn``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import MethodType
from typing import Any

import msgspec
from jinja2 import TemplateError

from areal.gateway.contract import RequestError

THINK_OPEN = "<think>"
# a chat template's reasoning switch, by the keyword argument it reads: on/off (Qwen3, GLM, SmolLM3,
# DeepSeek-V3.1; Granite's ``thinking``), or the effort itself (GPT-OSS: low | medium | high)
THINKING_SWITCHES = ("enable_thinking", "thinking", "reasoning_effort")
# What a template raises on messages it refuses: raise_exception's TemplateError, and the filters'
# TypeError / ValueError (``str + none``, ``items`` of a string): a 400, not a server error.
TEMPLATE_ERRORS = (TemplateError, TypeError, ValueError, KeyError, IndexError)
_ordered_encoder = msgspec.json.Encoder()  # keeps dict key order (the template sees it)
_TOOLS_CACHE = 64  # tools lists kept as template data, across sessions
_TOOLS_CACHE_BYTES = 4 << 20  # tools lists kept, counted by their encodings (their template data is a few times that)
_PROBE = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u", "name": None},
    {"role": "assistant", "content": "a", "reasoning_content": "r"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "id": "c", "function": {"name": "f", "arguments": '{"x": 1}'}}],
    },
    {"role": "tool", "content": "t", "tool_call_id": "c"},
    {"role": "user", "content": "v"},
]
_PROBE_TOOLS = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]
_SHOWN = "areal_probe_fn"  # a name no template writes unless it renders the tool or the call that carries it
_SHOWN_TOOLS = [{"type": "function", "function": {"name": _SHOWN, "description": "d", "parameters": {"type": "object"}}}]
_SHOWN_CALL = [
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "c", "function": {"name": _SHOWN, "arguments": "{}"}}]},
]
_SHOWN_DEVELOPER = "areal_probe_developer"  # the developer probe's text: in the render only if the template writes the role
# gateway.tool_template's built-in names: files of templates/ (this package's data)
TOOL_TEMPLATES = {"chatml-tools": "chatml-tools.jinja"}
_TEMPLATES_DIR = Path(__file__).with_name("templates")
_DICT_ATTRIBUTES = frozenset(dir(dict))  # names getattr answers on a plain dict (its methods)
_MISSING = object()
# names a request's chat_template_kwargs may not take: the render's own arguments (the template's,
# and apply_chat_template's when that renders)
_RESERVED_KWARGS = frozenset(
    (
        "messages conversation tools documents add_generation_prompt continue_final_message chat_template tokenize "
        "padding truncation max_length return_tensors return_dict return_assistant_tokens_mask tokenizer_kwargs"
    ).split()
)


def tool_template_path(name: str) -> Path:
    """The file of ``gateway.tool_template``: a built-in name (``TOOL_TEMPLATES``) or a path to a
    ``.jinja`` file; a ``ValueError`` naming the field otherwise."""
    if name in TOOL_TEMPLATES:
        return _TEMPLATES_DIR / TOOL_TEMPLATES[name]
    path = Path(name).expanduser()
    if path.suffix != ".jinja" or not path.is_file():
        raise ValueError(
            f"gateway.tool_template must be a built-in template ({', '.join(TOOL_TEMPLATES)}) or the path of a .jinja file, got {name!r}"
        )
    return path


def tool_template_source(name: str | None) -> str | None:
    """The text of ``gateway.tool_template`` (None: none set)."""
    return None if name is None else tool_template_path(name).read_text(encoding="utf-8")


class ChatTemplate:
    """The tokenizer's chat template, compiled for direct rendering where that is exact.
    ``tool_template``: the text requests that offer tools render with instead (module docstring)."""

    def __init__(self, tokenizer: Any, tool_template: str | None = None) -> None:
        self.tokenizer = tokenizer
        # the template's text by "has tools" (None: the tokenizer has none)
        self.sources = {has: self._own_source(has) for has in (False, True)}
        if tool_template is not None:
            self.sources[True] = tool_template
        self.tools_cache: dict[bytes, list[Any]] = {}  # template data of a tools list, by its encoding
        self._tools_cache_bytes = 0
        self.compiled: dict[bool, Any] = {}  # compiled template by "has tools"; empty: use the wrapper
        self._special_tokens: dict[str, Any] = {}
        self._plain: Callable[[Any], Any] = _identity
        self.argument_objects = False
        self.argument_objects = self._wants_argument_objects()
        self._compile()
        # a template that can leave <think> open at the end of a prompt (Qwen3.5, DeepSeek-V3.1 thinking)
        self.thinks = any(THINK_OPEN in (source or "") for source in self.sources.values())
        # what the template of each kind of request shows (``check_tools``)
        self.renders_tools = self._shows([{"role": "user", "content": "u"}], _SHOWN_TOOLS, True)
        self.renders_calls = {has: self._shows(_SHOWN_CALL, _SHOWN_TOOLS if has else None, False) for has in (False, True)}
        self.renders_developer = {has: self._renders_developer(has) for has in (False, True)}
        # the keyword argument that turns reasoning on and off (``thinking_switch``), per kind of request
        self.thinking_switch = {has: thinking_switch(self.sources[has]) for has in (False, True)}

    def _own_source(self, tools: bool) -> str | None:
        try:
            return self.tokenizer.get_chat_template(None, _PROBE_TOOLS if tools else None)
        except (ValueError, AttributeError):  # no chat template
            return None

    def _shows(self, messages: list[dict], tools: list[dict] | None, generation: bool) -> bool:
        """Whether the render of the probe writes the probe's function name (the tool, or the call)."""
        try:
            return _SHOWN in self.wrapper_text(messages, tools, generation)
        except Exception:  # deliberate: a template that refuses the probe answers for itself, with its own 400
            return True

    def _renders_developer(self, tools: bool) -> bool:
        """Whether the template of requests with (``tools``) or without tools has a branch for the
        ``developer`` role: it names the role, and the probe's developer text reaches its render.
        A template that refuses the probe, drops the message, or writes any role as it comes
        (plain ChatML, whose models never saw a developer turn) has none: the core hands it
        developer messages as system ones (``generation.validate_turn``)."""
        if "developer" not in (self.sources[tools] or ""):
            return False
        probe = [{"role": "developer", "content": _SHOWN_DEVELOPER}, {"role": "user", "content": "u"}]
        try:
            return _SHOWN_DEVELOPER in self.wrapper_text(probe, _PROBE_TOOLS if tools else None, True)
        except Exception:  # deliberate: a template that refuses the role has no branch for it
            return False

    def check_tools(self, tools: list[dict] | None, messages: list[dict]) -> None:
        """A 400 naming ``gateway.tool_template`` for a request with tools when the template that
        renders it has no tool branch, or a history whose tool calls it drops (module docstring)."""
        has = bool(tools)
        fix = (
            f"set gateway.tool_template to a template that renders them ({', '.join(TOOL_TEMPLATES)} for a ChatML model: "
            "tools in the system turn, calls as <tool_call> JSON; or the path of a .jinja file)"
        )
        if has and not (self.renders_tools or self.renders_calls[True]):
            raise RequestError(400, f"the chat template has no tool branch: these tools would not reach the prompt; {fix}", param="tools")
        if self.renders_calls[has]:
            return
        for i, m in enumerate(messages):
            if m.get("role") == "assistant" and m.get("tool_calls"):
                if self.renders_calls[True]:  # only requests that offer tools render calls
                    fix = "send the tools with the request: the template renders tool calls only for requests that offer tools"
                raise RequestError(
                    400,
                    f"the chat template would drop the tool calls of messages[{i}] from the prompt; {fix}",
                    param=f"messages[{i}].tool_calls",
                )

    def _wants_argument_objects(self) -> bool:
        """Whether tool-call arguments go to the template as objects (see the module docstring)."""
        call = {"type": "function", "id": "c", "function": {"name": "f", "arguments": '{"x": 1}'}}
        probe = [{"role": "user", "content": "u"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
        try:
            text = self.wrapper_text(probe, _PROBE_TOOLS, False)
        except Exception:  # deliberate: any failure of the template on text arguments is the evidence
            return True
        return '\\"x\\"' in text

    def _compile(self) -> None:
        """Compiled templates for direct rendering, kept only if they render the probe exactly as
        ``apply_chat_template`` does, with tools and without."""
        if None in self.sources.values():  # no template: apply_chat_template says so, as the request's 400
            return
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template, _plain_template_data

            compiled = {has: _compile_jinja_template(self.sources[has]) for has in (False, True)}
        except (ImportError, AttributeError, ValueError, TypeError):  # another transformers
            return
        self._plain = _plain_template_data
        self._special_tokens = _plain_template_data(dict(self.tokenizer.special_tokens_map))
        self.compiled = {has: compile_dict_first(t.environment, self.sources[has]) for has, t in compiled.items()}
        for tools in (None, _PROBE_TOOLS):
            for n, gen in ((len(_PROBE), True), (3, False)):
                try:
                    ok = self.render_text(_PROBE[:n], tools, gen) == self.wrapper_text(_PROBE[:n], tools, gen)
                except Exception:  # a template that rejects the probe: no evidence, so no fast path
                    ok = False
                if not ok:
                    self.compiled = {}
                    return

    def wrapper_text(self, messages: list[dict], tools: list[dict] | None, generation: bool, template_kwargs: dict | None = None) -> str:
        """The render through ``apply_chat_template`` (the reference the fast path is checked against)."""
        messages = [for_template(m, self.argument_objects) for m in messages]
        source = self.sources[bool(tools)]
        chosen = {} if source is None else {"chat_template": source}  # None: the tokenizer's error, as the request's 400
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation, **chosen, **(template_kwargs or {})
        )

    def render_text(self, messages: list[dict], tools: list[dict] | None, generation: bool, template_kwargs: dict | None = None) -> str:
        """The template's text for ``messages``; a template that refuses them is a 400 naming it."""
        render = self.renderer(messages, tools, template_kwargs)
        try:
            return render(len(messages), generation)
        except TEMPLATE_ERRORS as e:
            raise RequestError(400, f"the model's chat template cannot render these messages: {e}", param="messages") from None

    def renderer(self, messages: list[dict], tools: list[dict] | None, template_kwargs: dict | None = None) -> Callable[[int, bool], str]:
        """``render(n, generation)`` of ``messages[:n]``: each message is prepared once, for every render.
        ``template_kwargs``: the request's ``chat_template_kwargs`` (e.g. Qwen3's ``enable_thinking``)."""
        if not self.compiled:
            return lambda n, generation: self.wrapper_text(messages[:n], tools, generation, template_kwargs)
        plain, objects = self._plain, self.argument_objects
        chat = [_template_message(for_template(m, objects), plain) for m in messages]
        tools = self._template_tools(tools) if tools else None
        template = self.compiled[tools is not None]
        kwargs = {**self._special_tokens, **_plain_json(template_kwargs, plain)} if template_kwargs else self._special_tokens

        def render(n: int, generation: bool) -> str:
            return template.render(messages=chat[:n], tools=tools, documents=None, add_generation_prompt=generation, **kwargs)

        return render

    def _template_tools(self, tools: list[dict]) -> list[Any]:
        """``_plain_json(tools)``, kept by the tools' order-preserving encoding: an agent sends the
        same tools every turn, and their plain copy is most of a turn's preparation. Sharing one
        copy across renders is safe: the sandbox is immutable, so no template can change it."""
        key = _ordered_encoder.encode(tools)  # key order kept: ``tojson`` writes keys in order
        plain = self.tools_cache.get(key)
        if plain is None:
            plain = _plain_json(tools, self._plain)
            if len(key) > _TOOLS_CACHE_BYTES // 8:  # no agent's tools are this large: not worth an eighth of it
                return plain
            if len(self.tools_cache) >= _TOOLS_CACHE or self._tools_cache_bytes + len(key) > _TOOLS_CACHE_BYTES:
                self.tools_cache.clear()
                self._tools_cache_bytes = 0
            self.tools_cache[key] = plain
            self._tools_cache_bytes += len(key)
        return plain


def thinking_switch(source: str | None) -> str | None:
    """The keyword argument of ``source`` that switches the model's reasoning, or None: the first of
    ``THINKING_SWITCHES`` the template reads from its context (a variable it never sets itself,
    found in its syntax tree, not its text: ``message.thinking`` is no switch). ``enable_thinking``
    comes first: DeepSeek-V3.1's template reads it as an alias of its own ``thinking``."""
    if not source:
        return None
    try:
        from jinja2 import meta
        from transformers.utils.chat_template_utils import _compile_jinja_template

        names = meta.find_undeclared_variables(_compile_jinja_template(source).environment.parse(source))
    except (ImportError, AttributeError, TemplateError):  # another transformers, or a template it cannot parse: no switch known
        return None
    return next((name for name in THINKING_SWITCHES if name in names), None)


def check_template_kwargs(kwargs: Any) -> None:
    """A request's ``chat_template_kwargs``: None, or an object keyed by names the template may take."""
    if kwargs is None:
        return
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) and k.isidentifier() and k not in _RESERVED_KWARGS for k in kwargs):
        raise RequestError(
            400,
            'chat_template_kwargs must be an object of the chat template\'s keyword arguments, e.g. {"enable_thinking": false} '
            f"(not {', '.join(sorted(_RESERVED_KWARGS))})",
            param="chat_template_kwargs",
        )


def for_template(message: dict, objects: bool) -> dict:
    """A message as SGLang and vLLM hand it to the template: a null content as "", and tool-call
    arguments as objects when ``objects``. The request's dict is not changed."""
    if "content" in message and message["content"] is None:
        message = {**message, "content": ""}
    return with_argument_objects(message) if objects else message


def with_argument_objects(message: dict) -> dict:
    """``message`` with its tool calls' JSON-text arguments as objects (text that is not a JSON
    object stays text); the request's dict is not changed."""
    calls = message.get("tool_calls")
    if not calls or not isinstance(calls, list):
        return message
    converted = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        args = fn.get("arguments") if isinstance(fn, dict) else None
        if isinstance(args, str):
            value = _decode_arguments(args)
            if isinstance(value, dict):
                call = {**call, "function": {**fn, "arguments": value}}
        converted.append(call)
    return {**message, "tool_calls": converted}


def _decode_arguments(text: str) -> Any:
    try:
        return json.loads(text) if text.strip() else {}
    except ValueError:  # deliberate: arguments that are not JSON stay text, as the client sent them
        return None


def _identity(value: Any) -> Any:
    return value


def _template_message(message: dict, plain: Callable[[Any], Any]) -> dict:
    """What ``apply_chat_template`` hands the template for one message, in one pass: None-valued
    keys dropped, the reasoning aliases, plain JSON data (``_plain_json``)."""
    m = {k if type(k) is str else plain(k): v if type(v) is str else _plain_json(v, plain) for k, v in message.items() if v is not None}
    if "reasoning_content" in m or "thinking" in m or "reasoning" in m:
        reasoning = next(m[k] for k in ("reasoning_content", "thinking", "reasoning") if k in m)
        m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
    return m


def _plain_json(value: Any, plain: Callable[[Any], Any]) -> Any:
    """``plain(value)`` (transformers' rebuild of template data out of JSON types), answered here for
    the exact JSON types a decoded request is made of: the same copy without a Python call and
    ABC check per leaf. Any other type (a str subclass, a dataclass, a pydantic model) goes to ``plain``."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if kind is dict:
        return {k if type(k) is str else plain(k): _plain_json(v, plain) for k, v in value.items()}
    if kind is list:
        return [_plain_json(v, plain) for v in value]
    return plain(value)


def compile_dict_first(environment: Any, source: str) -> Any:
    """``source`` compiled in an overlay of a sandboxed Jinja environment, made cheaper per render.

    - ``getattr`` on a plain dict is one lookup. The sandbox resolves ``message.role`` as
      ``getattr(message, "role")``, which raises ``AttributeError`` for every dict key before it
      tries ``message["role"]``; the exceptions were most of a render's cost. For an exact ``dict``
      and a name that is not one of ``dict``'s attributes, the sandbox's answer is the item or
      ``undefined``, so answer that directly. Any other object or name (``message.items``,
      ``"x".strip``) takes the sandbox's path.
    - ``loop.first`` and friends likewise: for an exact ``LoopContext`` (no ``__getitem__``, none of
      the types or mutable ABCs the sandbox guards) and a name without a leading underscore, the
      sandbox's answer is the attribute or ``undefined``, after a dozen ``isinstance`` checks.
    - The template's globals are one flat dict instead of a ChainMap over the environment's: each
      render copies them into its context, and iterating a ChainMap is a Python loop per key. They
      are fixed when transformers compiles the template, so the snapshot is exact.
    """
    from jinja2.runtime import LoopContext

    overlay = environment.overlay()
    sandboxed = type(environment).getattr

    def getattr_dict_first(self: Any, obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if kind is dict and attribute not in _DICT_ATTRIBUTES:
            value = obj.get(attribute, _MISSING)
        elif kind is LoopContext and attribute[:1] != "_":
            value = getattr(obj, attribute, _MISSING)
        else:
            return sandboxed(self, obj, attribute)
        return self.undefined(obj=obj, name=attribute) if value is _MISSING else value

    overlay.getattr = MethodType(getattr_dict_first, overlay)  # an instance attribute: only this overlay changes
    template = overlay.from_string(source)
    template.globals = dict(template.globals)
    return template
