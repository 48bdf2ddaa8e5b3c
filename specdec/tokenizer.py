"""Tokenizers and chat templates: text <-> token ids for the models specdec loads.

A :class:`Tokenizer` wraps a Hugging Face ``tokenizers.Tokenizer`` (the Rust library does the
BPE work; nothing here is a hand-written BPE) and adds what a decoding loop needs: the
end-of-generation ids, byte-exact pieces for streaming, and chat-template rendering.

Two sources:

* GGUF metadata (:meth:`Tokenizer.from_gguf_metadata`, or :func:`tokenizer_from_gguf_metadata`
  which returns None when the file has no tokenizer). The tokenizer is rebuilt so that
  ``encode`` gives the ids llama.cpp's ``llama_tokenize(..., parse_special=True)`` gives:
  the same pre-tokenizer regexes per ``tokenizer.ggml.pre`` (taken from llama.cpp's
  ``llama-vocab.cpp``), special tokens matched as whole tokens, the same BOS/EOS rules, and the
  same end-of-generation set.
* A Hugging Face model directory (:meth:`Tokenizer.from_hf_dir`): ``tokenizer.json`` plus
  ``tokenizer_config.json`` / ``generation_config.json`` / ``chat_template.jinja`` when present.

Example::

    tok = Tokenizer.from_gguf_metadata(model._core.gguf_metadata())
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi!"}])
    ids = tok.encode(prompt, add_special=True)
    text = tok.decode(generated_ids, skip_special=True)
"""

from __future__ import annotations

import codecs
import json
import operator
import os
import re
import threading
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

try:
    import tokenizers
    from tokenizers import AddedToken, models, normalizers, pre_tokenizers, processors
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("specdec.tokenizer needs the Hugging Face `tokenizers` package: "
                      "pip install tokenizers") from e

__all__ = ["Tokenizer", "IncrementalDecoder", "tokenizer_from_gguf_metadata", "SUPPORTED_GGUF_MODELS",
           "SUPPORTED_GGUF_PRE"]

PathLike = Union[str, "os.PathLike[str]"]

# GGUF token types (tokenizer.ggml.token_type), as llama.cpp's llama_token_type.
TOKEN_UNDEFINED = 0
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6

# ---------------------------------------------------------------------------------------------
# Pre-tokenizers, from llama.cpp src/llama-vocab.cpp (llm_tokenizer_bpe, llama_vocab::impl::load)
# ---------------------------------------------------------------------------------------------

# llama.cpp runs the expressions of a list one after the other, each splitting the pieces the
# previous one left into matches and the stretches between them (Split "isolated" here).
_RE_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# llama.cpp's adaptation of (?i:'s|'t|...) (case-insensitive contractions, ASCII only).
_RE_CONTRACTIONS_CI = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_RE_LLAMA3 = (_RE_CONTRACTIONS_CI + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_RE_QWEN2 = (_RE_CONTRACTIONS_CI + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# LLAMA_VOCAB_PRE_TYPE_DEFAULT (also used when tokenizer.ggml.pre is missing).
_REGEXES_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _RE_GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")
_REGEXES_GPT2 = (_RE_GPT2,)
# LLAMA_VOCAB_PRE_TYPE_SMOLLM / STARCODER / ...: every digit on its own, then GPT-2's regex (what
# SmolLM2's tokenizer.json says as Sequence[Digits(individual_digits), ByteLevel(use_regex)]).
_REGEXES_DIGITS_GPT2 = (r"\p{N}", _RE_GPT2)
_REGEXES_LLAMA3 = (_RE_LLAMA3,)
_REGEXES_QWEN2 = (_RE_QWEN2,)
# LLAMA_VOCAB_PRE_TYPE_GPT4O: tokenizer.json's expression (upper-case runs, then lower-case ones,
# with combining marks), then llama.cpp's rewrite of it by look-aheads, cut again: where the two
# differ (an upper-case letter outside ASCII before an upper-case run, a combining mark) the
# second one's pieces are llama.cpp's (tests/fixtures/pretokenizer_gpt_4o.json).
_RE_GPT4O_CASE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_RE_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
             + _RE_GPT4O_CASE
             + r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
             + _RE_GPT4O_CASE
             + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_RE_GPT4O_LOOKAHEAD = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
                       + _RE_CONTRACTIONS_CI
                       + r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
                       + _RE_CONTRACTIONS_CI
                       + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_REGEXES_GPT4O = (_RE_GPT4O, _RE_GPT4O_LOOKAHEAD)


class _Pre:
    """One tokenizer.ggml.pre family: regexes and the flags llama.cpp sets with it."""

    __slots__ = ("regexes", "clean_spaces", "ignore_merges", "add_bos")

    def __init__(self, regexes: Tuple[str, ...], clean_spaces: bool = True,
                 ignore_merges: bool = False, add_bos: bool = False):
        self.regexes = regexes
        self.clean_spaces = clean_spaces
        self.ignore_merges = ignore_merges
        self.add_bos = add_bos


def _pre_table() -> Dict[str, _Pre]:
    t: Dict[str, _Pre] = {"default": _Pre(_REGEXES_DEFAULT)}
    for name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                 "midm-2.0", "lfm2"):
        t[name] = _Pre(_REGEXES_LLAMA3, ignore_merges=True, add_bos=True)
    for name in ("dbrx", "smaug-bpe"):
        t[name] = _Pre(_REGEXES_LLAMA3)
    # "gpt2" is not a name llama.cpp knows (it says "gpt-2"); accepted here as an alias.
    for name in ("gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "exaone4", "gigachat",
                 "a.x-4.0", "mellum"):
        t[name] = _Pre(_REGEXES_GPT2)
    for name in ("trillion", "granite-docling"):
        t[name] = _Pre(_REGEXES_GPT2, clean_spaces=False)
    for name in ("smollm", "command-r"):
        t[name] = _Pre(_REGEXES_DIGITS_GPT2, clean_spaces=False)
    for name in ("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"):
        t[name] = _Pre(_REGEXES_DIGITS_GPT2)
    for name in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"):
        t[name] = _Pre(_REGEXES_QWEN2, clean_spaces=False)
    for name in ("stablelm2", "megrez"):
        t[name] = _Pre(_REGEXES_QWEN2)
    for name in ("gpt-4o", "llama4", "kanana2", "talkie"):
        t[name] = _Pre(_REGEXES_GPT4O, clean_spaces=False)
    return t


_PRE = _pre_table()

#: tokenizer.ggml.model values from_gguf_metadata understands.
SUPPORTED_GGUF_MODELS: Tuple[str, ...] = ("gpt2", "llama")
#: tokenizer.ggml.pre values understood for tokenizer.ggml.model == "gpt2" (missing = "default").
SUPPORTED_GGUF_PRE: Tuple[str, ...] = tuple(sorted(_PRE))

# ---------------------------------------------------------------------------------------------
# Special-token detection by text, as llama.cpp's llama_vocab::impl::load does it
# ---------------------------------------------------------------------------------------------

_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
              "<\uff5cend\u2581of\u2581sentence\uff5c>",
              "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PRE_TEXTS = ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>",
                  "<PRE>", "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>")
_FIM_SUF_TEXTS = ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>",
                  "<SUF>", "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>")
_FIM_MID_TEXTS = ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>",
                  "<MID>", "\u2581<MID>", "<|code_middle|>", "<|middle|>")
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
#: Token texts llama.cpp treats as end of generation (besides eos/eot/eom and the FIM
#: pad/repo/file-separator tokens).
EOG_TEXTS: Tuple[str, ...] = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[")

# ---------------------------------------------------------------------------------------------
# GPT-2 byte <-> unicode table (byte-level BPE)
# ---------------------------------------------------------------------------------------------


def _bytes_to_unicode() -> Dict[int, str]:
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


_UNICODE_TO_BYTE: Dict[str, int] = {c: b for b, c in _bytes_to_unicode().items()}
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>\Z")


def _bytelevel_bytes(text: str) -> bytes:
    """Raw bytes of a byte-level token text; a text with characters outside the GPT-2 byte
    alphabet is taken as plain UTF-8 (as the ByteLevel decoder of `tokenizers` does)."""
    try:
        return bytes([_UNICODE_TO_BYTE[c] for c in text])
    except KeyError:
        return text.encode("utf-8", "surrogatepass")


def _clean_spaces(text: bytes) -> bytes:
    """llama.cpp's detokenize clean-up (clean_up_tokenization_spaces), byte for byte."""
    t = bytearray(text)
    # first pass: " ?", " !", " .", " ," lose the space
    n = len(t)
    total = 1 if n else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    # second pass: " ' " -> "'"
    n = total
    total = 1 if n else 0
    i = 1
    while i < n:
        x = t[i]
        if x == 0x27 and i + 1 < n and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    # third pass: " 's", " 'm", " 're", " 've" lose the space
    n = total
    total = 1 if n else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = t[i + 1]
            if x1 in b"sm":
                total -= 1
            elif x1 not in b"td" and i + 2 < n:
                x2 = t[i + 2]
                if (x1 == 0x72 and x2 == 0x65) or (x1 == 0x76 and x2 == 0x65):  # 're 've
                    total -= 1
        t[total] = x
        total += 1
    return bytes(t[:total])


# ---------------------------------------------------------------------------------------------
# Metadata helpers
# ---------------------------------------------------------------------------------------------


def _as_list(meta: Mapping[str, Any], key: str, kind: type,
             required: bool = True) -> Optional[list]:
    v = meta.get(key)
    if v is None:
        if required:
            raise ValueError(f"GGUF tokenizer metadata is incomplete: {key!r} is missing")
        return None
    if isinstance(v, (str, bytes)) or not hasattr(v, "__len__"):
        raise ValueError(f"GGUF metadata {key!r} must be an array, got {type(v).__name__}")
    out = list(v)
    if kind is str:
        for i, x in enumerate(out):
            if isinstance(x, bytes):  # a GGUF string that is not valid UTF-8
                try:
                    out[i] = x.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ValueError(f"GGUF metadata {key!r}[{i}] is not valid UTF-8 ({e.reason} "
                                     f"at byte {e.start})") from None
            elif not isinstance(x, str):
                raise ValueError(f"GGUF metadata {key!r}[{i}] must be a string, "
                                 f"got {type(x).__name__}")
    elif kind is int:
        try:
            out = [int(operator.index(x)) for x in out]
        except TypeError:
            raise ValueError(f"GGUF metadata {key!r} must be an array of integers") from None
    elif kind is float:
        try:
            out = [float(x) for x in out]
        except (TypeError, ValueError):
            raise ValueError(f"GGUF metadata {key!r} must be an array of numbers") from None
    return out


def _meta_id(meta: Mapping[str, Any], key: str, default: Optional[int], n: int) -> Optional[int]:
    """A special-token id: the key's id, which must be an integer in [0, n) (ValueError naming
    the key otherwise), or the default when the key is missing (a default out of range is
    disabled, as llama.cpp does)."""
    if default is not None and not 0 <= default < n:
        default = None
    v = meta.get(key)
    if v is None:
        return default
    try:
        if isinstance(v, bool):
            raise TypeError
        v = int(operator.index(v))
    except TypeError:
        raise ValueError(f"GGUF metadata {key!r} must be an integer token id, "
                         f"got {v!r}") from None
    if not 0 <= v < n:
        raise ValueError(f"GGUF metadata {key!r} is {v}, out of the vocabulary's range "
                         f"[0, {n})")
    return v


def _meta_bool(meta: Mapping[str, Any], key: str, default: bool) -> bool:
    v = meta.get(key)
    return default if v is None else bool(v)


def _meta_str(meta: Mapping[str, Any], key: str) -> Optional[str]:
    v = meta.get(key)
    if isinstance(v, bytes):  # a GGUF string that is not valid UTF-8
        try:
            v = v.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"GGUF metadata {key!r} is not valid UTF-8 ({e.reason} at byte "
                             f"{e.start})") from None
    return v if isinstance(v, str) else None


def _first_id(text_to_id: Mapping[str, int], texts: Iterable[str]) -> Optional[int]:
    found = [text_to_id[t] for t in texts if t in text_to_id]
    return min(found) if found else None


def _llamacpp_specials(texts: Sequence[str], types: List[int], text_to_id: Mapping[str, int],
                       eos: Optional[int], ids: Mapping[str, Optional[int]]) -> FrozenSet[int]:
    """The end-of-generation set, as llama.cpp's vocab loader builds it. `ids` holds the
    eot/eom/fim ids given in metadata (or None). Updates `types` in place where llama.cpp
    overrides a token's attributes (control-looking tokens become control)."""

    def detect(key: str, cands: Sequence[str]) -> Optional[int]:
        if ids.get(key) is not None:
            return ids[key]
        # llama.cpp takes the first match in hash-map order; the lowest id here.
        tid = _first_id(text_to_id, cands)
        if tid is not None and types[tid] != TOKEN_CONTROL:
            types[tid] = TOKEN_CONTROL
        return tid

    eot = detect("eot", _EOT_TEXTS)
    eom = detect("eom", _EOM_TEXTS)
    for key, cands in (("fim_pre", _FIM_PRE_TEXTS), ("fim_suf", _FIM_SUF_TEXTS),
                       ("fim_mid", _FIM_MID_TEXTS)):
        detect(key, cands)
    fim_pad = detect("fim_pad", _FIM_PAD_TEXTS)
    fim_rep = detect("fim_rep", _FIM_REP_TEXTS)
    fim_sep = detect("fim_sep", _FIM_SEP_TEXTS)

    eog = {i for i in (fim_pad, fim_rep, fim_sep) if i is not None}
    for t in EOG_TEXTS:
        tid = text_to_id.get(t)
        if tid is not None:
            eog.add(tid)
            types[tid] = TOKEN_CONTROL
    # gpt-oss: these are always rendered (user-defined)
    for t in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
        tid = text_to_id.get(t)
        if tid is not None:
            types[tid] = TOKEN_USER_DEFINED
    eog.update(i for i in (eos, eot, eom) if i is not None)

    def present(t: str) -> Optional[int]:
        return next((i for i in eog if 0 <= i < len(texts) and texts[i] == t), None)

    # o200k_harmony / solar-open: <|end|> is not end of generation there
    end_id = present("<|end|>")
    has_call = present("<|call|>") is not None or present("<|calls|>") is not None
    has_return = present("<|return|>") is not None or present("<|flush|>") is not None
    if end_id is not None and has_call and has_return:
        eog.discard(end_id)
        types[end_id] = TOKEN_USER_DEFINED
    # gemma4 / paddleocr: </s> is not end of generation when <|tool_response> is
    s_id = present("</s>")
    if s_id is not None and present("<|tool_response>") is not None:
        eog.discard(s_id)
        types[s_id] = TOKEN_NORMAL
    return frozenset(i for i in eog if 0 <= i < len(texts))


def _spm_merges(tokens: Sequence[str], scores: Sequence[float],
                text_to_id: Mapping[str, int]) -> List[Tuple[str, str]]:
    """BPE merges equivalent to a SentencePiece-BPE vocabulary with scores: every split of a
    piece into two pieces of the vocabulary, ordered by the merged piece's score (highest first),
    as `transformers`' SentencePieceExtractor derives them for Llama tokenizers."""
    merges = []
    for tid, piece in enumerate(tokens):
        local = []
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            lid = text_to_id.get(left)
            if lid is not None:
                rid = text_to_id.get(right)
                if rid is not None:
                    local.append((lid, rid, left, right))
        local.sort()
        score = scores[tid]
        merges.extend((score, left, right) for _, _, left, right in local)
    merges.sort(key=lambda m: -m[0])  # stable: ties keep id order
    return [(left, right) for _, left, right in merges]


def _walk(node: Any) -> Iterable[Mapping[str, Any]]:
    if isinstance(node, Mapping):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def _decoder_style(decoder: Any) -> Tuple[str, bool]:
    """(piece style, add_space_prefix) from a tokenizer.json "decoder" node."""
    kinds = [d for d in _walk(decoder) if isinstance(d.get("type"), str)]
    types = {d["type"] for d in kinds}
    if "ByteLevel" in types:
        return "bytelevel", False
    spm = bool(types & {"ByteFallback", "Metaspace"}) or any(
        d["type"] == "Replace" and "\u2581" in json.dumps(d.get("pattern"), ensure_ascii=False)
        for d in kinds)
    if not spm:
        return "generic", False
    prefix = any(
        (d["type"] == "Strip" and d.get("content") == " " and int(d.get("start") or 0) >= 1)
        or (d["type"] == "Metaspace" and (d.get("prepend_scheme") in ("first", "always")
                                          or d.get("add_prefix_space") is True))
        for d in kinds)
    return "spm", prefix


# ---------------------------------------------------------------------------------------------
# Chat templates (as transformers' apply_chat_template renders them)
# ---------------------------------------------------------------------------------------------


def _validate_messages(messages: Any) -> List[Mapping[str, Any]]:
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, (list, tuple)):
        raise TypeError("messages must be a list of dicts like {'role': 'user', 'content': '...'}, "
                        f"got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise TypeError(f"messages[{i}] must be a dict with 'role' and 'content', "
                            f"got {type(m).__name__}")
        if "role" not in m:
            raise ValueError(f"messages[{i}] has no 'role'")
        if not isinstance(m["role"], str) or not m["role"]:
            raise ValueError(f"messages[{i}]['role'] must be a non-empty string, got {m['role']!r}")
        if "content" not in m:
            if m.get("tool_calls"):
                continue
            raise ValueError(f"messages[{i}] (role {m['role']!r}) has no 'content'")
        c = m["content"]
        if c is None and m.get("tool_calls"):
            continue
        if not isinstance(c, str):
            raise ValueError(f"messages[{i}]['content'] must be a string, got {type(c).__name__}")
    return list(messages)


def _compile_template(source: str):
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generation(Extension):
        """transformers' {% generation %} ... {% endgeneration %} block (marks assistant text
        for masks): rendered as its body here."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        from datetime import datetime
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ValueError(f"the chat template is not valid Jinja: {e}") from e


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------


class Tokenizer:
    """Text <-> token ids for one model, with its chat template.

    Build with :meth:`from_gguf_metadata` or :meth:`from_hf_dir`. Encoding is thread-safe.
    """

    def __init__(self, hf: "tokenizers.Tokenizer", tokens: Sequence[str], types: Sequence[int], *,
                 bos_id: Optional[int], eos_id: Optional[int], eog_ids: Iterable[int],
                 add_bos: bool, add_eos: bool = False, chat_template: Optional[str] = None,
                 piece_style: str = "bytelevel", add_space_prefix: bool = False,
                 clean_spaces: bool = False, source: str = "") -> None:
        """Low-level constructor; prefer :meth:`from_gguf_metadata` / :meth:`from_hf_dir`.

        hf: the `tokenizers.Tokenizer` that encodes (BOS/EOS added by its post-processor when
        `add_special_tokens` is true); tokens/types: text and GGUF token type of every id;
        piece_style: how a normal token's text maps to bytes ("bytelevel": GPT-2 byte alphabet,
        "spm": U+2581 for spaces, "generic": ask `hf` to decode it).
        """
        if piece_style not in ("bytelevel", "spm", "generic"):
            raise ValueError("piece_style must be 'bytelevel', 'spm' or 'generic', "
                             f"got {piece_style!r}")
        if len(tokens) != len(types):
            raise ValueError("tokens and types differ in length")
        self._hf = hf
        self._tokens: Tuple[str, ...] = tuple(tokens)
        self._types: Tuple[int, ...] = tuple(types)
        self._bos_id = bos_id
        self._eos_id = eos_id
        self._eog_ids = frozenset(eog_ids)
        self._add_bos = bool(add_bos)
        self._add_eos = bool(add_eos)
        self._chat_template = chat_template
        self._piece_style = piece_style
        self._add_space_prefix = bool(add_space_prefix)
        self._clean_spaces = bool(clean_spaces)
        self._source = source
        self._special_ids = frozenset(i for i, t in enumerate(self._types)
                                      if t in (TOKEN_CONTROL, TOKEN_UNKNOWN))
        self._pieces: List[Optional[bytes]] = [None] * len(self._tokens)
        self._lock = threading.Lock()
        self._template_cache: Optional[Tuple[str, Any]] = None

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any]) -> "Tokenizer":
        """Build the tokenizer a GGUF file describes (a dict of its metadata: key -> value,
        arrays as lists).

        Supported: ``tokenizer.ggml.model`` "gpt2" (byte-level BPE from ``tokens`` + ``merges``,
        pre-tokenizer by ``tokenizer.ggml.pre``: see :data:`SUPPORTED_GGUF_PRE`) and "llama"
        (SentencePiece BPE from ``tokens`` + ``scores``, byte fallback). Raises ValueError for
        an unsupported model or pre-tokenizer, or incomplete/malformed metadata.
        """
        if not isinstance(meta, Mapping):
            raise TypeError(f"meta must be a dict of GGUF metadata, got {type(meta).__name__}")
        model = _meta_str(meta, "tokenizer.ggml.model")
        if model is None:
            raise ValueError("GGUF metadata has no tokenizer ('tokenizer.ggml.model' is missing)")
        if model not in SUPPORTED_GGUF_MODELS:
            raise ValueError(f"unsupported GGUF tokenizer model {model!r} (tokenizer.ggml.model); "
                             f"supported: {', '.join(SUPPORTED_GGUF_MODELS)}")
        tokens = _as_list(meta, "tokenizer.ggml.tokens", str)
        n = len(tokens)
        if n == 0:
            raise ValueError("GGUF metadata 'tokenizer.ggml.tokens' is empty")
        types = _as_list(meta, "tokenizer.ggml.token_type", int, required=False)
        if types is None:
            types = [TOKEN_NORMAL] * n
        elif len(types) < n:
            raise ValueError(f"GGUF metadata 'tokenizer.ggml.token_type' has {len(types)} entries "
                             f"for {n} tokens")
        types = types[:n]
        for i, t in enumerate(types):
            if not TOKEN_UNDEFINED <= t <= TOKEN_BYTE:
                raise ValueError(f"GGUF metadata 'tokenizer.ggml.token_type'[{i}] is {t}, not a "
                                 f"GGUF token type ({TOKEN_UNDEFINED} to {TOKEN_BYTE})")
        # llama.cpp: an empty token text becomes "[EMPTY_<id>]"; duplicates are an error.
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        text_to_id: Dict[str, int] = {}
        for i, t in enumerate(tokens):
            if text_to_id.setdefault(t, i) != i:
                raise ValueError(f"duplicate token in GGUF vocabulary: {t!r} has ids "
                                 f"{text_to_id[t]} and {i}")

        if model == "gpt2":
            pre_name = _meta_str(meta, "tokenizer.ggml.pre") or "default"
            pre = _PRE.get(pre_name)
            if pre is None:
                raise ValueError(
                    f"unsupported GGUF pre-tokenizer {pre_name!r} (tokenizer.ggml.pre) for "
                    f"tokenizer model 'gpt2'; supported: {', '.join(SUPPORTED_GGUF_PRE)}")
            bos_default: Optional[int] = 11  # llama.cpp's defaults for BPE vocabularies
            eos_default: Optional[int] = 11
            unk_default: Optional[int] = None
            add_bos_default = pre.add_bos
            add_space_prefix = False
            clean_spaces = pre.clean_spaces
        else:
            pre, pre_name = None, ""
            bos_default, eos_default, unk_default = 1, 2, 0
            add_bos_default = True
            add_space_prefix = True
            clean_spaces = False
        add_space_prefix = _meta_bool(meta, "tokenizer.ggml.add_space_prefix", add_space_prefix)

        bos = _meta_id(meta, "tokenizer.ggml.bos_token_id", bos_default, n)
        eos = _meta_id(meta, "tokenizer.ggml.eos_token_id", eos_default, n)
        unk = _meta_id(meta, "tokenizer.ggml.unknown_token_id", unk_default, n)
        add_bos = _meta_bool(meta, "tokenizer.ggml.add_bos_token", add_bos_default)
        add_eos = _meta_bool(meta, "tokenizer.ggml.add_eos_token", False)
        if add_bos and bos is None:
            raise ValueError("tokenizer.ggml.add_bos_token is true, but there is no BOS token id")
        if add_eos and eos is None:
            raise ValueError("tokenizer.ggml.add_eos_token is true, but there is no EOS token id")
        ids = {
            "eot": _meta_id(meta, "tokenizer.ggml.eot_token_id", None, n),
            "eom": _meta_id(meta, "tokenizer.ggml.eom_token_id", None, n),
            "fim_pre": _meta_id(meta, "tokenizer.ggml.fim_pre_token_id",
                                _meta_id(meta, "tokenizer.ggml.prefix_token_id", None, n), n),
            "fim_suf": _meta_id(meta, "tokenizer.ggml.fim_suf_token_id",
                                _meta_id(meta, "tokenizer.ggml.suffix_token_id", None, n), n),
            "fim_mid": _meta_id(meta, "tokenizer.ggml.fim_mid_token_id",
                                _meta_id(meta, "tokenizer.ggml.middle_token_id", None, n), n),
            "fim_pad": _meta_id(meta, "tokenizer.ggml.fim_pad_token_id", None, n),
            "fim_rep": _meta_id(meta, "tokenizer.ggml.fim_rep_token_id", None, n),
            "fim_sep": _meta_id(meta, "tokenizer.ggml.fim_sep_token_id", None, n),
        }
        eog = _llamacpp_specials(tokens, types, text_to_id, eos, ids)

        try:
            if model == "gpt2":
                merges_raw = _as_list(meta, "tokenizer.ggml.merges", str)
                merges = []
                for i, m in enumerate(merges_raw):
                    k = m.find(" ", 1)  # as llama.cpp splits "a b"
                    if k < 0:
                        raise ValueError(f"GGUF merge {i} ({m!r}) is not of the form 'a b'")
                    merges.append((m[:k], m[k + 1:]))
                bpe = models.BPE(vocab=text_to_id, merges=merges, ignore_merges=pre.ignore_merges)
                hf = tokenizers.Tokenizer(bpe)
                hf.pre_tokenizer = pre_tokenizers.Sequence(
                    [pre_tokenizers.Split(tokenizers.Regex(r), behavior="isolated")
                     for r in pre.regexes]
                    + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                                use_regex=False)])
                piece_style = "bytelevel"
            else:
                # the merge order comes from the scores: without them the vocabulary cannot
                # tokenize as SentencePiece does
                scores = _as_list(meta, "tokenizer.ggml.scores", float)
                if len(scores) < n:
                    raise ValueError(f"GGUF metadata 'tokenizer.ggml.scores' has {len(scores)} "
                                     f"entries for {n} tokens")
                merges = _spm_merges(tokens, scores, text_to_id)
                bpe = models.BPE(vocab=text_to_id, merges=merges,
                                 unk_token=tokens[unk] if unk is not None else None,
                                 fuse_unk=True, byte_fallback=True)
                hf = tokenizers.Tokenizer(bpe)
                norm = [normalizers.Replace(" ", "\u2581")]
                if add_space_prefix:
                    norm.insert(0, normalizers.Prepend("\u2581"))
                hf.normalizer = normalizers.Sequence(norm)
                piece_style = "spm"
        except ValueError:
            raise
        except Exception as e:  # tokenizers raises its own exception types
            raise ValueError(f"cannot build the GGUF tokenizer ({model}): {e}") from e

        cls._add_special_tokens(hf, tokens, types)
        if add_bos or add_eos:
            cls._set_post_processor(hf, bos if add_bos else None, eos if add_eos else None)
        return cls(hf, tokens, types, bos_id=bos, eos_id=eos, eog_ids=eog, add_bos=add_bos,
                   add_eos=add_eos, chat_template=_meta_str(meta, "tokenizer.chat_template"),
                   piece_style=piece_style, add_space_prefix=add_space_prefix,
                   clean_spaces=clean_spaces,
                   source=f"gguf:{model}/{pre_name}" if model == "gpt2" else f"gguf:{model}")

    @staticmethod
    def _add_special_tokens(hf: "tokenizers.Tokenizer", tokens: Sequence[str],
                            types: Sequence[int]) -> None:
        # llama.cpp matches control and unknown tokens only when parsing specials, user-defined
        # tokens always: `special` added tokens of `tokenizers` vs plain added tokens.
        special = [AddedToken(tokens[i], special=True, normalized=False)
                   for i, t in enumerate(types) if t in (TOKEN_CONTROL, TOKEN_UNKNOWN)]
        user = [AddedToken(tokens[i], special=False, normalized=False)
                for i, t in enumerate(types) if t == TOKEN_USER_DEFINED]
        if special:
            hf.add_special_tokens(special)
        if user:
            hf.add_tokens(user)

    @staticmethod
    def _set_post_processor(hf: "tokenizers.Tokenizer", bos: Optional[int],
                            eos: Optional[int]) -> None:
        single, specials = ["$A"], []
        if bos is not None:
            single.insert(0, "BOS")
            specials.append(("BOS", bos))
        if eos is not None:
            single.append("EOS")
            specials.append(("EOS", eos))
        # template names are placeholders, mapped to ids directly
        hf.post_processor = processors.TemplateProcessing(
            single=" ".join(single), pair=" ".join(single + ["$B"]), special_tokens=specials)

    @classmethod
    def from_hf_dir(cls, path: PathLike) -> Optional["Tokenizer"]:
        """Load the tokenizer of a Hugging Face model directory, or None when it has no
        ``tokenizer.json``.

        Reads ``tokenizer.json``; ``tokenizer_config.json`` (chat_template, bos/eos tokens,
        add_bos_token, clean_up_tokenization_spaces), ``chat_template.jinja`` /
        ``chat_template.json`` and ``generation_config.json`` (eos_token_id, int or list) when
        present. Raises FileNotFoundError when `path` is not a directory.
        """
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"not a directory: {path!r}")
        tj = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tj):
            return None

        def read_json(name: str) -> dict:
            p = os.path.join(path, name)
            if not os.path.isfile(p):
                return {}
            try:
                with open(p, encoding="utf-8") as f:
                    v = json.load(f)
            except (OSError, ValueError) as e:
                raise ValueError(f"cannot read {p}: {e}") from e
            if not isinstance(v, dict):
                raise ValueError(f"{p} must hold a JSON object")
            return v

        with open(tj, encoding="utf-8") as f:
            text = f.read()
        try:
            spec = json.loads(text)
            hf = tokenizers.Tokenizer.from_str(text)
        except Exception as e:
            raise ValueError(f"cannot load {tj}: {e}") from e
        cfg = read_json("tokenizer_config.json")
        gen = read_json("generation_config.json")

        vocab = hf.get_vocab(with_added_tokens=True)
        n = max(hf.get_vocab_size(with_added_tokens=True), max(vocab.values(), default=-1) + 1)
        tokens = [""] * n
        for t, i in vocab.items():
            tokens[i] = t
        style, add_space_prefix = _decoder_style(spec.get("decoder"))
        byte_fallback = bool((spec.get("model") or {}).get("byte_fallback"))
        types = [TOKEN_NORMAL] * n
        if byte_fallback:
            for i, t in enumerate(tokens):
                if _BYTE_TOKEN.match(t):
                    types[i] = TOKEN_BYTE
        for i, at in hf.get_added_tokens_decoder().items():
            if 0 <= i < n:
                types[i] = TOKEN_CONTROL if at.special else TOKEN_USER_DEFINED

        def token_id(v: Any) -> Optional[int]:
            if isinstance(v, Mapping):
                v = v.get("content")
            return hf.token_to_id(v) if isinstance(v, str) else None

        bos = token_id(cfg.get("bos_token"))
        eos = token_id(cfg.get("eos_token"))
        gen_eos = gen.get("eos_token_id")
        gen_eos_ids = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        gen_eos_ids = [i for i in gen_eos_ids if isinstance(i, int) and 0 <= i < n]
        if eos is None and gen_eos_ids:
            eos = gen_eos_ids[0]
        gen_bos = gen.get("bos_token_id")
        if bos is None and isinstance(gen_bos, int) and 0 <= gen_bos < n:
            bos = gen_bos
        text_to_id = {t: i for i, t in enumerate(tokens) if t}
        eog = set(_llamacpp_specials(tokens, types, text_to_id, eos, {}))
        eog.update(gen_eos_ids)
        # What tokenizer.json's post-processor adds; tokenizer_config.json's add_bos_token /
        # add_eos_token override it, as transformers' Llama tokenizers do.
        with_sp = hf.encode("a", add_special_tokens=True).ids
        extra = len(with_sp) - len(hf.encode("a", add_special_tokens=False).ids)
        has_bos = extra > 0 and bos is not None and with_sp[0] == bos
        has_eos = extra > 0 and eos is not None and with_sp[-1] == eos
        add_bos = cfg["add_bos_token"] if isinstance(cfg.get("add_bos_token"), bool) else has_bos
        add_eos = cfg["add_eos_token"] if isinstance(cfg.get("add_eos_token"), bool) else has_eos
        add_bos, add_eos = add_bos and bos is not None, add_eos and eos is not None
        if (add_bos, add_eos) != (has_bos, has_eos):
            cls._set_post_processor(hf, bos if add_bos else None, eos if add_eos else None)

        template = None
        tpl_file = os.path.join(path, "chat_template.jinja")
        if os.path.isfile(tpl_file):
            with open(tpl_file, encoding="utf-8") as f:
                template = f.read()
        else:
            template = read_json("chat_template.json").get("chat_template",
                                                           cfg.get("chat_template"))
        if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
            named = {d.get("name"): d.get("template") for d in template if isinstance(d, Mapping)}
            template = named.get("default", next(iter(named.values()), None))
        if not isinstance(template, str):
            template = None

        return cls(hf, tokens, types, bos_id=bos, eos_id=eos, eog_ids=eog, add_bos=add_bos,
                   add_eos=add_eos, chat_template=template, piece_style=style,
                   add_space_prefix=add_space_prefix,
                   clean_spaces=bool(cfg.get("clean_up_tokenization_spaces", False)),
                   source=f"hf:{path}")

    # ---- properties --------------------------------------------------------------------------

    def __repr__(self) -> str:
        return (f"specdec.Tokenizer({self._source}, vocab={self.vocab_size}, bos={self._bos_id}, "
                f"eos={self._eos_id}, eog={sorted(self._eog_ids)}, add_bos={self._add_bos}, "
                f"chat_template={'yes' if self._chat_template else 'no'})")

    @property
    def vocab_size(self) -> int:
        """Number of token ids (0 .. vocab_size-1)."""
        return len(self._tokens)

    @property
    def bos_id(self) -> Optional[int]:
        """Beginning-of-sequence id, or None."""
        return self._bos_id

    @property
    def eos_id(self) -> Optional[int]:
        """End-of-sequence id, or None."""
        return self._eos_id

    @property
    def eog_ids(self) -> FrozenSet[int]:
        """Ids that end generation (llama.cpp's rule: eos, eot, eom, the FIM pad/repo/file-sep
        tokens, and tokens whose text is in :data:`EOG_TEXTS`; for HF directories also
        generation_config.json's eos_token_id)."""
        return self._eog_ids

    @property
    def special_ids(self) -> FrozenSet[int]:
        """Control (and unknown) token ids: parsed from text only with ``parse_special``,
        dropped by ``decode(skip_special=True)``."""
        return self._special_ids

    @property
    def chat_template(self) -> Optional[str]:
        """The Jinja chat template, or None."""
        return self._chat_template

    @property
    def add_bos(self) -> bool:
        """Whether ``encode(..., add_special=True)`` prepends BOS (the model asks for it)."""
        return self._add_bos

    @property
    def tokens(self) -> Tuple[str, ...]:
        """Text of every token id, as stored (byte-level tokens in the GPT-2 alphabet)."""
        return self._tokens

    def token_type(self, token_id: int) -> int:
        """GGUF token type of an id (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
        6 byte), after llama.cpp's fix-ups of control-looking tokens."""
        return self._types[self._check_id(token_id)]

    # ---- encoding ----------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> List[int]:
        """Token ids of `text`.

        add_special: add BOS (and EOS) where the model asks for it (:attr:`add_bos`).
        parse_special: control-token texts in `text` (``<|im_start|>``) become those tokens, as
        llama.cpp's ``tokenize(..., special=True)``; when false they are tokenized as plain text
        (user-defined tokens are matched either way, as in llama.cpp).
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        try:
            with self._lock:
                want = not parse_special
                if self._hf.encode_special_tokens != want:
                    self._hf.encode_special_tokens = want
                enc = self._hf.encode(text, add_special_tokens=bool(add_special))
        except Exception as e:  # tokenizers raises TypeError/its own exceptions
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as u:
                raise ValueError(
                    f"text is not valid Unicode ({u.reason} at index {u.start})") from None
            raise ValueError(f"cannot tokenize the text: {e}") from e
        return enc.ids

    # ---- decoding ----------------------------------------------------------------------------

    def _check_id(self, token_id: Any) -> int:
        if isinstance(token_id, bool):
            raise TypeError("a token id must be an int, got bool")
        try:
            i = operator.index(token_id)
        except TypeError:
            raise TypeError(f"a token id must be an int, got {type(token_id).__name__}") from None
        if not 0 <= i < len(self._tokens):
            raise ValueError(f"token id {i} is out of range [0, {len(self._tokens)})")
        return i

    def token_to_piece(self, token_id: int, skip_special: bool = False) -> bytes:
        """The raw bytes of one token (for streaming: a piece may hold part of a multi-byte
        UTF-8 character; join pieces before decoding, or use an incremental UTF-8 decoder).

        Control and unknown tokens give their text, or b"" with `skip_special`; user-defined
        tokens always give their text; unused tokens give b"" (as llama.cpp's token_to_piece).
        """
        i = self._check_id(token_id)
        t = self._types[i]
        if skip_special and t in (TOKEN_CONTROL, TOKEN_UNKNOWN):
            return b""
        p = self._pieces[i]
        if p is None:
            p = self._pieces[i] = self._make_piece(i)
        return p

    def _make_piece(self, i: int) -> bytes:
        text, t = self._tokens[i], self._types[i]
        if t in (TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED):
            return text.encode("utf-8", "surrogatepass")
        if t == TOKEN_BYTE:
            m = _BYTE_TOKEN.match(text)
            if m:
                return bytes([int(m.group(1), 16)])
        elif t != TOKEN_NORMAL:
            return b""
        if self._piece_style == "bytelevel":
            return _bytelevel_bytes(text)
        if self._piece_style == "spm":
            return text.replace("\u2581", " ").encode("utf-8", "surrogatepass")
        return self._hf.decode([i], skip_special_tokens=False).encode("utf-8", "surrogatepass")

    def decode(self, ids: Iterable[int], skip_special: bool = False,
               clean_spaces: Optional[bool] = None) -> str:
        """Text of token ids (llama.cpp's detokenize).

        The bytes of all pieces are joined first, so UTF-8 characters split across tokens come
        out whole; an incomplete or invalid sequence becomes U+FFFD (never raises).
        skip_special: drop control tokens (and a leading BOS / trailing EOS the model adds).
        clean_spaces: llama.cpp's clean-up of " ." " ," " 's" ...; None = the model's setting
        (on for GPT-2/Llama-3-style BPE vocabularies, off for smollm, qwen2 and SentencePiece).
        A SentencePiece vocabulary with add_space_prefix drops the space of the first token.
        """
        ids = [self._check_id(i) for i in ids]
        if self._piece_style == "generic":
            return self._hf.decode(ids, skip_special_tokens=bool(skip_special))
        remove_space = self._add_space_prefix
        if skip_special and self._add_bos and ids and ids[0] == self._bos_id:
            remove_space = False
            ids = ids[1:]
        if skip_special and self._add_eos and ids and ids[-1] == self._eos_id:
            ids = ids[:-1]
        out = bytearray()
        for k, i in enumerate(ids):
            p = self.token_to_piece(i, skip_special)
            if k == 0 and remove_space and p[:1] == b" ":
                p = p[1:]
            out += p
        data = bytes(out)
        if self._clean_spaces if clean_spaces is None else clean_spaces:
            data = _clean_spaces(data)
        return data.decode("utf-8", errors="replace")

    def incremental_decoder(self) -> "IncrementalDecoder":
        """A decoder fed one token id at a time, whose output pieces join to
        ``decode(all ids)``, each id costing time independent of how many came before: see
        :class:`IncrementalDecoder`."""
        return IncrementalDecoder(self)

    # ---- chat template -----------------------------------------------------------------------

    def apply_chat_template(self, messages: List[Dict[str, Any]],
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render the chat template over `messages` (list of {"role": str, "content": str}),
        as `transformers`' apply_chat_template does: Jinja2 in an immutable sandbox with
        trim_blocks/lstrip_blocks, the ``raise_exception`` and ``strftime_now`` globals, the
        ``tojson`` filter, and the variables ``messages``, ``add_generation_prompt``,
        ``bos_token``, ``eos_token``, ``tools``/``documents`` (None) plus `kwargs`.

        Returns the prompt text; encode it with ``encode(text, add_special=True)``. Raises
        ValueError when the model has no template or the template raises, TypeError/ValueError
        for malformed messages.
        """
        if self._chat_template is None:
            raise ValueError("this model has no chat template (no tokenizer.chat_template in the "
                             "GGUF file / no chat_template in tokenizer_config.json); "
                             "format the prompt yourself and use encode()")
        msgs = _validate_messages(messages)
        import jinja2

        if self._template_cache is None or self._template_cache[0] != self._chat_template:
            self._template_cache = (self._chat_template, _compile_template(self._chat_template))
        template = self._template_cache[1]
        variables: Dict[str, Any] = {
            "bos_token": self._tokens[self._bos_id] if self._bos_id is not None else "",
            "eos_token": self._tokens[self._eos_id] if self._eos_id is not None else "",
            "tools": None,
            "documents": None,
        }
        variables.update(kwargs)
        variables["messages"] = msgs
        variables["add_generation_prompt"] = bool(add_generation_prompt)
        try:
            return template.render(**variables)
        except (jinja2.exceptions.TemplateError, RecursionError, OverflowError) as e:
            # OverflowError: the sandbox's refusal of a huge range(); RecursionError: a macro
            # that calls itself without end
            raise ValueError(f"the chat template failed: {e}") from e


# Bytes the clean-up reads (" ?", " !", " .", " ,", " ' ", " 's", " 'm", " 're", " 've"):
# any other byte is "plain" to it.
_CLEAN_BYTES = frozenset(b" '?!.,")


class IncrementalDecoder:
    """:meth:`Tokenizer.decode` (default arguments) of a growing list of ids, one id at a time.

    ``push(id)`` returns the text that is now final and ``flush()`` the rest, so that
    ``"".join(pushes) + flush() == tok.decode(ids)`` exactly. Each call decodes only a short
    tail, so a stream of n tokens costs O(n), where re-decoding everything at every token would
    cost O(n**2).

    Byte-level and SentencePiece vocabularies decode by joining token bytes; their bytes go
    through an incremental UTF-8 decoder, which holds back a character split over tokens
    (byte-fallback tokens included) until its last byte and otherwise decodes as a one-shot
    decode does. SentencePiece's dropped first space is taken off the first token's bytes, as
    ``decode`` does. With llama.cpp's space clean-up on (" ." -> ".", " 's" -> "'s"), whose
    rules look from a space or quote at most two bytes ahead, bytes wait for a *cut*: a point
    after two plain bytes (none of ``" '?!.,"``), where cleaning the bytes before and after it
    apart gives what cleaning them together gives, since no rule spans it.

    For a vocabulary decoded by the ``tokenizers`` library ("generic" pieces: WordPiece and the
    like) the tail is a window of the last tokens: the text the newest tokens add to the
    decoding of the window before them, emitted once it does not end in an incomplete
    character; the pieces join to ``decode(ids)`` for decoders whose output for a token depends
    on few tokens before it.
    """

    def __init__(self, tok: Tokenizer) -> None:
        """tok: the tokenizer whose :meth:`Tokenizer.decode` this reproduces."""
        self._tok = tok
        self._generic = tok._piece_style == "generic"
        self._clean = tok._clean_spaces
        self._strip_space = tok._add_space_prefix  # of the first token's bytes only
        self._reset()

    def _reset(self) -> None:
        self._first = True
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buf = bytearray()  # clean-up on: the bytes after the last cut
        self._ids: List[int] = []  # generic: the window of tokens
        self._read = 0  # generic: tokens of the window already emitted past its context

    def push(self, token_id: int) -> str:
        """Add one token id; returns the text that no later id can change (may be "")."""
        i = self._tok._check_id(token_id)
        if self._generic:
            return self._push_generic(i)
        p = self._tok.token_to_piece(i)
        if self._first:
            self._first = False
            if self._strip_space and p[:1] == b" ":
                p = p[1:]
        if not self._clean:
            return self._utf8.decode(p)
        start = max(len(self._buf) + 1, 2)  # the cuts up to here were looked at before
        self._buf += p
        b = self._buf
        for cut in range(len(b), start - 1, -1):  # the last cut: after two plain bytes
            if b[cut - 1] not in _CLEAN_BYTES and b[cut - 2] not in _CLEAN_BYTES:
                out = self._utf8.decode(_clean_spaces(bytes(b[:cut])))
                del b[:cut]
                return out
        return ""

    def pending(self) -> str:
        """The text held back so far, as :meth:`flush` gives it (an incomplete character as
        U+FFFD), leaving the decoder as it is: the pushes so far and this join to ``decode`` of
        the ids so far."""
        if self._generic:
            hf, ids, read = self._tok._hf, self._ids, self._read
            return hf.decode(ids, skip_special_tokens=False)[
                len(hf.decode(ids[:read], skip_special_tokens=False)):]
        state = self._utf8.getstate()
        out = self._utf8.decode(_clean_spaces(bytes(self._buf)) if self._clean else b"",
                                final=True)
        self._utf8.setstate(state)
        return out

    def flush(self) -> str:
        """The text still held back; the decoder starts again empty after it."""
        if self._generic:
            hf, ids, read = self._tok._hf, self._ids, self._read
            out = hf.decode(ids, skip_special_tokens=False)[
                len(hf.decode(ids[:read], skip_special_tokens=False)):]
        else:
            out = self._utf8.decode(_clean_spaces(bytes(self._buf)) if self._clean else b"",
                                    final=True)
        self._reset()
        return out

    def _push_generic(self, i: int) -> str:
        dec = self._tok._hf.decode
        self._ids.append(i)
        before = dec(self._ids[:self._read], skip_special_tokens=False)
        now = dec(self._ids, skip_special_tokens=False)
        if len(now) <= len(before) or now.endswith("\ufffd"):
            return ""
        # keep the last emitted tokens as the context of the next window
        self._ids = self._ids[self._read:]
        self._read = len(self._ids)
        return now[len(before):]


def tokenizer_from_gguf_metadata(meta: Mapping[str, Any]) -> Optional[Tokenizer]:
    """:meth:`Tokenizer.from_gguf_metadata`, or None when the metadata holds no usable tokenizer:
    no ``tokenizer.ggml.model`` or ``tokenizer.ggml.tokens`` (or model "none"/"no_vocab"), or a
    "gpt2" model without ``tokenizer.ggml.merges``. A tokenizer that is there but unsupported
    (another model or pre-tokenizer) or malformed still raises ValueError."""
    if not isinstance(meta, Mapping):
        raise TypeError(f"meta must be a dict of GGUF metadata, got {type(meta).__name__}")
    model = _meta_str(meta, "tokenizer.ggml.model")
    if model is None or model in ("none", "no_vocab") or meta.get("tokenizer.ggml.tokens") is None:
        return None
    if model == "gpt2" and meta.get("tokenizer.ggml.merges") is None:
        return None
    return Tokenizer.from_gguf_metadata(meta)
