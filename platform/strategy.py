"""The strategy object: which serving choices a variant makes.

Three kinds of factor, one object:

- **built-in** factors, the in-repo runtime's (:class:`Strategy`; ``ablab.inference``
  registers a component per factor). Unknown nested fields are refused with their name.
- **gateway** factors (:class:`OpenStrategy`): ``backend``, ``model``, ``params`` (request
  body overrides such as ``temperature``) and ``system_prompt``, read by the gateway, and the
  prompt strategies ``dialogue_state``, ``prompt_split`` and ``context_prune``
  (:class:`DialogueState`, :class:`PromptSplit`, :class:`ContextPrune`; the gateway's
  ``prompting`` package applies them to any OpenAI-compatible backend).
- **declared** factors: any other top-level key, allowed only when a deployment declared
  it (``POST /v1/factors``). Validating with ``context={"factors": catalog}`` refuses an
  undeclared factor by name and a bad value with what is allowed; without a catalog only
  the form of the key and value is checked (the registry always checks with one).

``content_hash`` is stable across processes and Python versions: it hashes the canonical
JSON of the fully-defaulted built-in object, so ``{}`` and an explicit all-defaults
strategy hash the same. Fields added after the schema's first release (``ADDED_FIELDS``),
gateway factors and declared factors enter that JSON only when set, so adding them
changed no stored strategy's hash.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal, Protocol

import re2
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

STRATEGY_SCHEMA_VERSION = 1


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CompressionMethod(StrEnum):
    none = "none"
    entropy = "entropy"  # token-entropy pruning of the prompt


class Precision(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"
    int8 = "int8"  # dynamic INT8 quantization of linear layers


class BatchingPolicy(StrEnum):
    none = "none"  # one request at a time
    fixed = "fixed"  # fixed batch size, flush on window
    adaptive = "adaptive"  # batch size and window follow the live arrival rate


class PromptCompression(_Frozen):
    method: CompressionMethod = CompressionMethod.none
    tau: float = Field(default=0.18, ge=0.0, le=1.0, description="Entropy threshold below which tokens are pruned.")
    window: int = Field(default=32, ge=1, le=4096, description="Tokens per pruning window.")


class Batching(_Frozen):
    policy: BatchingPolicy = BatchingPolicy.none
    max_batch: int = Field(default=8, ge=1, le=1024)
    window_ms: float = Field(default=5.0, ge=0.0, le=10_000.0, description="Longest wait to fill a batch.")
    ttft_slo_ms: float | None = Field(
        default=None, gt=0.0, le=600_000.0, description="Adaptive only: admit requests that can still meet this TTFT first."
    )
    tpot_slo_ms: float | None = Field(
        default=None, gt=0.0, le=60_000.0, description="Adaptive only: size each step so running sequences keep this TPOT."
    )
    shed_late: bool = Field(
        default=False, description="Adaptive with a TTFT SLO: refuse (HTTP 503) requests that can no longer meet it."
    )

    @model_validator(mode="after")
    def _slo_needs_adaptive(self) -> Batching:
        slo_set = [name for name in ("ttft_slo_ms", "tpot_slo_ms", "shed_late") if getattr(self, name) not in (None, False)]
        if slo_set and self.policy is not BatchingPolicy.adaptive:
            raise ValueError(f"batching.{slo_set[0]} is set but batching.policy is '{self.policy.value}'; SLOs steer the adaptive policy only")
        if self.shed_late and self.ttft_slo_ms is None:
            raise ValueError("batching.shed_late needs batching.ttft_slo_ms: shedding refuses requests past that SLO")
        return self


# (object, field) pairs added after schema version 1 was released: omitted from the
# canonical JSON while at their default, which keeps every earlier content_hash
ADDED_FIELDS: frozenset[tuple[str, str]] = frozenset({("batching", "ttft_slo_ms"), ("batching", "tpot_slo_ms"), ("batching", "shed_late")})


class Strategy(_Frozen):
    """Serving choices of one variant. Defaults describe the plain baseline."""

    schema_version: Literal[1] = STRATEGY_SCHEMA_VERSION
    prompt_template: str = Field(default="plain", min_length=1, max_length=64, pattern=r"^[a-z0-9_\-]+$")
    compression: PromptCompression = PromptCompression()
    lora_adapter: str | None = Field(default=None, max_length=64, pattern=r"^[a-z0-9_\-]+$")
    sparse_ffn_k: int | None = Field(default=None, ge=1, le=65_536, description="Top-k FFN neurons per token; None = dense.")
    kv_shards: int = Field(default=1, ge=1, le=64, description="KV-cache chunks along the token axis.")
    batching: Batching = Batching()
    precision: Precision = Precision.fp32
    cot_depth: int = Field(default=0, ge=0, le=8, description="Chain-of-thought steps requested in the prompt.")
    validation_threshold: float | None = Field(
        default=None, ge=0.0, le=1.0, description="Re-run when answer confidence falls below this."
    )

    @model_validator(mode="after")
    def _coherent(self) -> Strategy:
        if self.batching.policy is BatchingPolicy.none and self.batching.max_batch != Batching().max_batch:
            raise ValueError("batching.max_batch is set but batching.policy is 'none'")
        return self

    def canonical_json(self) -> str:
        data = self.model_dump(mode="json")
        for obj, name in ADDED_FIELDS:
            if data[obj][name] == type(getattr(self, obj)).model_fields[name].default:
                del data[obj][name]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16]

    def factors(self) -> dict[str, object]:
        """Flat factor → level map, for factorial attribution (``compression.tau`` style keys)."""
        flat: dict[str, object] = {}
        for key, value in self.model_dump(mode="json").items():
            if key == "schema_version":
                continue
            if isinstance(value, dict):
                flat.update({f"{key}.{sub}": v for sub, v in value.items()})
            else:
                flat[key] = value
        return flat

    @classmethod
    def runtime_view(cls, strategy: Mapping[str, Any] | None) -> Strategy:
        """The in-repo runtime's typed strategy from any stored strategy mapping: the
        built-in factors only (gateway and declared factors are not the runtime's)."""
        data = dict(strategy or {})
        return Strategy.model_validate({k: v for k, v in data.items() if k in Strategy.model_fields})


FACTOR_NAMES: tuple[str, ...] = tuple(Strategy().factors())
"""Flat names of the built-in (runtime) factors."""


# ---------------------------------------------------------------- open strategies

GATEWAY_FACTORS: tuple[str, ...] = ("backend", "model", "params", "system_prompt", "dialogue_state", "prompt_split",
                                    "context_prune")
"""Factors the OpenAI-compatible gateway reads: which backend and model serve, request
body overrides, the system prompt placed before the caller's messages, and the prompt
strategies (dialogue-state slots, the latency-aware hard/soft split, entropy pruning)."""

PROMPT_STRATEGY_FACTORS: tuple[str, ...] = ("dialogue_state", "prompt_split", "context_prune")
DECLARED_NAME = r"^[a-z][a-z0-9_]{0,63}$"
PARAM_KEY = r"^[A-Za-z_][A-Za-z0-9_\-]{0,63}$"
MAX_PARAMS = 64
MAX_DECLARED = 64
MAX_TEXT = 10_000  # characters in one string value of a param or declared factor
MAX_LIST = 256
# Body fields a strategy must not override: the caller's request owns them, or another
# factor does.
RESERVED_PARAMS: dict[str, str] = {
    "model": "set the `model` factor instead",
    "messages": "the caller's messages are not a factor; use `system_prompt` or `prompt_template`",
    "prompt": "the caller's prompt is not a factor; use `prompt_template`",
    "stream": "the caller decides whether to stream",
    "stream_options": "the gateway manages stream options",
    "user": "the caller's `user` identifies the unit",
}

_DECLARED_RE = re.compile(DECLARED_NAME)
_PARAM_RE = re.compile(PARAM_KEY)
_RESERVED_TOP = frozenset(Strategy.model_fields) | frozenset(GATEWAY_FACTORS)


class FactorChecker(Protocol):
    """What validation needs from a factor catalog (``ablab.platform.registry.factors.catalog``)."""

    def problems(self, strategy: OpenStrategy) -> list[tuple[str, str]]: ...


def json_level(value: Any, where: str, *, lists: bool) -> Any:
    """A factor level as stored: JSON scalars (integral floats written as integers, so
    ``1.0`` and ``1`` hash alike) or, where ``lists``, a bounded list of them."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value} is not a finite number")
        return int(value) if value.is_integer() and abs(value) < 2**53 else value
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise ValueError(f"{where}: text longer than {MAX_TEXT} characters")
        return value
    if isinstance(value, list) and lists:
        if len(value) > MAX_LIST:
            raise ValueError(f"{where}: more than {MAX_LIST} items")
        return [json_level(v, f"{where}[{i}]", lists=False) for i, v in enumerate(value)]
    allowed = "a JSON scalar or a list of scalars" if lists else "one JSON scalar (number, string, boolean)"
    raise ValueError(f"{where}: expected {allowed}, got {type(value).__name__}")


# ---------------------------------------------------------------- prompt strategies (gateway)

SLOT_NAME = r"^[a-z][a-z0-9_]{0,31}$"
MAX_SLOTS = 32
MAX_SLOT_PATTERN = 256  # characters, as for targeting regexes
_SLOT_RE2_MAX_MEM = 1 << 20  # bytes RE2 may use for one compiled slot pattern
DEFAULT_DELIMITER = "<<<soft>>>"
DEFAULT_STATE_HEADER = "Known facts from earlier in this conversation:"


def compile_slot_pattern(pattern: str) -> Any:
    """The RE2 program of a dialogue-state slot pattern; ValueError says why RE2 refuses it.
    A pattern has at most one capture group: the slot's value (else the whole match)."""
    options = re2.Options()
    options.log_errors = False
    options.max_mem = _SLOT_RE2_MAX_MEM
    try:
        program = re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(f"RE2 refuses {pattern!r} ({reason}); slot patterns run in linear time, so backreferences "
                         "(\\1) and lookaround ((?=, (?!, (?<=, (?<!) are not supported") from exc
    if program.groups > 1:
        raise ValueError(f"{pattern!r} has {program.groups} capture groups; at most one (the slot's value) is allowed: "
                         "write the others as (?:...)")
    return program


def _slot_pattern(pattern: str) -> str:
    compile_slot_pattern(pattern)
    return pattern


def _no_none(handler: Any, model: BaseModel) -> dict[str, Any]:
    return {k: v for k, v in handler(model).items() if v is not None}


class DialogueState(_Frozen):
    """``dialogue_state``: the conversation's history is replaced by explicit slots (each
    extracted by its RE2 pattern from the turns in order; a slot changes only when a later turn
    sets it), rendered into a system message, plus the last turn."""

    slots: dict[Annotated[str, Field(pattern=SLOT_NAME)],
                Annotated[str, Field(min_length=1, max_length=MAX_SLOT_PATTERN), AfterValidator(_slot_pattern)]] = Field(
        min_length=1, max_length=MAX_SLOTS,
        description="Slot name -> RE2 pattern; its one capture group (else the whole match) is the slot's value.")
    roles: tuple[Literal["user", "assistant"], ...] = Field(
        default=("user",), min_length=1, max_length=2, description="Whose turns set slots.")
    header: str = Field(default=DEFAULT_STATE_HEADER, min_length=1, max_length=512,
                        description="First line of the system message that carries the slots.")


class PromptSplit(_Frozen):
    """``prompt_split``: in each message, the text before ``delimiter`` is hard (always kept) and
    the text after it soft; the soft text is cut to the tokens the latency budget allows at the
    backend's prefill rate (``prefill_tps`` when declared, else the gateway's measured one)."""

    prefill_tps: float | None = Field(
        default=None, gt=0.0, le=10_000_000.0,
        description="Declared prefill rate (prompt tokens/s); unset: measured from the gateway's own requests.")
    latency_budget_ms: float = Field(gt=0.0, le=600_000.0, description="Prefill time the whole prompt may take.")
    delimiter: str = Field(default=DEFAULT_DELIMITER, min_length=1, max_length=64,
                           description="Marks where a message's hard prefix ends and its soft rest begins.")
    keep: Literal["end", "start"] = Field(default="end", description="Which soft text survives a cut: the latest or the earliest.")

    @field_validator("latency_budget_ms")
    @classmethod
    def _leaves_a_hard_prefix(cls, ms: float, info: ValidationInfo) -> float:
        tps = info.data.get("prefill_tps")
        if tps is not None and math.floor(tps * ms / 1000.0) < 1:
            raise ValueError(f"{ms:g} ms at prefill_tps={tps:g} is {tps * ms / 1000.0:.3g} tokens: a budget that leaves "
                             "no token for the hard prefix")
        return ms

    @field_validator("delimiter")
    @classmethod
    def _visible(cls, delimiter: str) -> str:
        if not delimiter.strip():
            raise ValueError("the delimiter must hold a visible character (whitespace alone marks nothing)")
        return delimiter

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        return _no_none(handler, self)


class ContextPrune(_Frozen):
    """``context_prune``: token-entropy pruning with the backend's own tokenizer and token
    probabilities where it offers them, else the in-repo scorer (the event says which)."""

    window: int = Field(default=32, ge=1, le=4096, description="Tokens per pruning window (each keeps its most surprising).")
    tau: float = Field(default=0.18, ge=0.0, le=1.0, description="Normalised surprisal below which a token is pruned.")
    scope: Literal["last_user", "user"] = Field(default="last_user", description="The last user message, or every user message.")


class OpenStrategy(Strategy):
    """A variant's whole strategy: built-in, gateway and declared factors.

    It is a :class:`Strategy`, so the in-repo runtime serves it as one (ignoring what is
    not its own). Dumped, gateway factors appear only when set, so the stored mapping and
    the content hash of a built-in-only strategy are what they always were.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    backend: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$",
        description="Name of a backend configured in the gateway; none = the gateway's default.",
    )
    model: str | None = Field(
        default=None, min_length=1, max_length=256, pattern=r"^[^\x00-\x1f]+$",
        description="The `model` sent to the backend; none = the caller's.",
    )
    params: dict[str, JsonValue] = Field(
        default_factory=dict, description="Request-body overrides (temperature, top_p, max_tokens, ...): JSON scalars or lists."
    )
    system_prompt: str | None = Field(
        default=None, min_length=1, max_length=32_768, description="System message placed before the caller's messages."
    )
    dialogue_state: DialogueState | None = Field(
        default=None, description="Replace the conversation's history by declared slots plus the last turn.")
    prompt_split: PromptSplit | None = Field(
        default=None, description="Keep each message's hard prefix; cut the soft rest to the latency budget's tokens.")
    context_prune: ContextPrune | None = Field(
        default=None, description="Token-entropy pruning with the backend's tokenizer and probabilities.")

    @model_validator(mode="before")
    @classmethod
    def _declared_form(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        if "policy" in data:
            # a policy strategy (docs/policies.md): per request it picks one of its arms, each an
            # ordinary strategy, so it holds nothing else; the registry validates the policy
            # itself (ablab.platform.policy.parse_policy), which needs the factor catalog and
            # the experiment's custom metrics this model does not have
            if not isinstance(data["policy"], Mapping):
                raise ValueError(f"policy: expected a mapping (kind, arms, ...), got {type(data['policy']).__name__}")
            # a stored policy strategy comes back from the registry dumped, with every built-in
            # factor at its default beside `policy`: those say nothing and are dropped
            defaults = _default_dump(cls)
            others = sorted(str(k) for k in data if k not in ("policy", "schema_version") and data[k] != defaults.get(k, _UNSET))
            if others:
                raise ValueError(f"a policy strategy holds only `policy`; put {', '.join(others)} in each arm")
            kept = {k: v for k, v in data.items() if k in ("policy", "schema_version")}
            return {**kept, "policy": json.loads(json.dumps(data["policy"]))}
        extra = [k for k in data if k not in cls.model_fields]
        if len(extra) > MAX_DECLARED:
            raise ValueError(f"at most {MAX_DECLARED} declared factors per strategy, got {len(extra)}")
        out = dict(data)
        for name in extra:
            if not isinstance(name, str) or not _DECLARED_RE.match(name):
                raise ValueError(f"unknown factor {name!r}: factor names are lowercase letters, digits and _ ({DECLARED_NAME})")
            out[name] = json_level(data[name], name, lists=False)
            if out[name] is None:
                raise ValueError(f"{name}: null is not a level; leave the factor out to use its default")
        return out

    @field_validator("params")
    @classmethod
    def _params(cls, params: dict[str, Any]) -> dict[str, Any]:
        if len(params) > MAX_PARAMS:
            raise ValueError(f"at most {MAX_PARAMS} params, got {len(params)}")
        out = {}
        for key, value in params.items():
            if not _PARAM_RE.match(key):
                raise ValueError(f"params.{key}: names are letters, digits, _ and - ({PARAM_KEY})")
            if key in RESERVED_PARAMS:
                raise ValueError(f"params.{key}: not overridable ({RESERVED_PARAMS[key]})")
            out[key] = json_level(value, f"params.{key}", lists=True)
        return out

    @model_validator(mode="after")
    def _declared_values(self, info: ValidationInfo) -> OpenStrategy:
        catalog = (info.context or {}).get("factors") if isinstance(info.context, Mapping) else None
        if catalog is not None:
            problems = catalog.problems(self)
            if problems:
                raise ValueError("; ".join(message for _, message in problems))
        return self

    @model_serializer(mode="wrap")
    def _omit_unset_gateway(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        for name in GATEWAY_FACTORS:
            if name in data and data[name] in (None, {}):
                del data[name]
        return data

    def factors(self) -> dict[str, object]:
        """Flat factor → level map; a prompt strategy (``dialogue_state``, ``prompt_split``,
        ``context_prune``) is one factor whose level is its whole mapping (its fields act
        together, and the dashboard edits it as one JSON object)."""
        data = self.model_dump(mode="json")
        whole = {name: data[name] for name in PROMPT_STRATEGY_FACTORS if name in data}
        if "policy" in data:  # a policy is one factor: its arms act together
            whole["policy"] = data["policy"]
        flat = {k: v for k, v in super().factors().items() if k.split(".", 1)[0] not in whole}
        flat.update(whole)
        return flat

    def declared(self) -> dict[str, Any]:
        """The declared factors this strategy sets (a ``policy`` is not one)."""
        return {k: v for k, v in (self.__pydantic_extra__ or {}).items() if k != "policy"}

    @property
    def policy(self) -> dict[str, Any] | None:
        """The policy mapping of a policy strategy (docs/policies.md), else None."""
        value = (self.__pydantic_extra__ or {}).get("policy")
        return value if isinstance(value, dict) else None


_UNSET = object()
_DEFAULTS: dict[type, dict[str, Any]] = {}


def _default_dump(cls: type[BaseModel]) -> dict[str, Any]:
    """The JSON dump of a strategy that sets nothing (its built-in defaults), computed once."""
    if cls not in _DEFAULTS:
        _DEFAULTS[cls] = cls().model_dump(mode="json")
    return _DEFAULTS[cls]


def open_strategy(strategy: Mapping[str, Any] | None, *, factors: FactorChecker | None = None) -> OpenStrategy:
    """Parse a stored or submitted strategy mapping; with ``factors``, check it fully."""
    return OpenStrategy.model_validate(dict(strategy or {}), context={"factors": factors} if factors is not None else None)


def content_hash(strategy: Mapping[str, Any] | None) -> str:
    """The content hash of any strategy mapping (built-in, gateway and declared factors)."""
    return open_strategy(strategy).content_hash


def reserved_name(name: str) -> bool:
    """Whether ``name`` belongs to a built-in or gateway factor (or its object)."""
    return name.split(".", 1)[0] in _RESERVED_TOP and not name.startswith("params.")
