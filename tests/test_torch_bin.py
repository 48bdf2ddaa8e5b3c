"""PyTorch checkpoints (torch.save's zip format) read without torch and without running pickled
code (csrc/format/torch_bin.c). torch is not imported: the tests write the checkpoints
themselves, a ZIP (Python's zipfile, or a writer laid out as PyTorch's: 64-byte aligned data,
ZIP64 end records) holding <archive>/data.pkl, a pickle whose opcodes are written here by hand
as torch.save's pickler (protocol 2) emits them for a state dict, and <archive>/data/<key>, the
raw storages. Values are compared bit for bit with what was written; every refusal is a
ValueError whose message names the problem."""

from __future__ import annotations

import json
import pickle
import pickletools
import random
import struct
import subprocess
import sys
import zipfile
import zlib

import numpy as np
import pytest

from specdec import _core

# ---- a pickle writer mirroring torch.save (protocol 2) ----


class Pickle:
    """Opcodes as the C pickler writes them for a state dict: every non-empty tuple, dict,
    string and global is memoized (BINPUT) and a repeated string or global is fetched
    (BINGET)."""

    def __init__(self) -> None:
        self.b = bytearray(b"\x80\x02")  # PROTO 2
        self.memo: dict = {}

    def put(self, key=None) -> None:
        i = len(self.memo)
        self.memo[key if key is not None else ("#", i)] = i
        self.b += b"q" + bytes([i]) if i < 256 else b"r" + struct.pack("<I", i)

    def get(self, key) -> bool:
        if key not in self.memo:
            return False
        i = self.memo[key]
        self.b += b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i)
        return True

    def glob(self, module: str, name: str) -> None:
        if not self.get(("g", module, name)):
            self.b += b"c" + module.encode() + b"\n" + name.encode() + b"\n"
            self.put(("g", module, name))

    def str(self, s: str) -> None:
        if not self.get(("s", s)):
            e = s.encode()
            self.b += b"X" + struct.pack("<I", len(e)) + e
            self.put(("s", s))

    def int(self, x: int) -> None:
        if 0 <= x < 256:
            self.b += b"K" + bytes([x])
        elif 0 <= x < 65536:
            self.b += b"M" + struct.pack("<H", x)
        elif -(2**31) <= x < 2**31:
            self.b += b"J" + struct.pack("<i", x)
        else:
            n = (x.bit_length() + 8) // 8
            self.b += b"\x8a" + bytes([n]) + x.to_bytes(n, "little", signed=True)

    def tuple(self, items) -> None:
        if not items:
            self.b += b")"  # EMPTY_TUPLE, not memoized
            return
        if len(items) > 3:
            self.b += b"("
        for it in items:
            it()
        self.b += b"t" if len(items) > 3 else bytes([0x84 + len(items)])  # TUPLE1..3
        self.put()

    def ordered_dict(self) -> None:
        self.glob("collections", "OrderedDict")
        self.b += b")R"  # EMPTY_TUPLE REDUCE
        self.put()

    def tensor(self, storage: str, key: str, numel: int, offset: int, shape, stride=None):
        if stride is None:
            stride = [int(np.prod(shape[i + 1:])) for i in range(len(shape))]
        self.glob("torch._utils", "_rebuild_tensor_v2")
        self.b += b"("
        self.tuple([lambda: self.str("storage"), lambda: self.glob("torch", storage),
                    lambda: self.str(key), lambda: self.str("cpu"), lambda: self.int(numel)])
        self.b += b"Q"  # BINPERSID
        self.int(offset)
        self.tuple([lambda x=x: self.int(x) for x in shape])
        self.tuple([lambda x=x: self.int(x) for x in stride])
        self.b += b"\x89"  # NEWFALSE: requires_grad
        self.ordered_dict()  # backward_hooks
        self.b += b"t"
        self.put()
        self.b += b"R"
        self.put()


STORAGE = {"F32": ("FloatStorage", np.float32), "F16": ("HalfStorage", np.float16),
           "BF16": ("BFloat16Storage", np.uint16), "I64": ("LongStorage", np.int64),
           "BOOL": ("BoolStorage", np.bool_)}


def state_dict_pickle(tensors, top="ordered", metadata=True, extra=None) -> bytes:
    """tensors: [(name, dtype, storage key, storage numel, offset, shape, stride or None)].
    top: 'ordered' (an OrderedDict, as state_dict() returns) or 'dict'. extra(p) may write a
    value of its own as the dict's last entry."""
    p = Pickle()
    if top == "ordered":
        p.ordered_dict()
    else:
        p.b += b"}"
        p.put()
    n = len(tensors) + (extra is not None)
    if n > 1:
        p.b += b"("
    for name, dt, key, numel, off, shape, stride in tensors:
        p.str(name)
        p.tensor(STORAGE[dt][0], key, numel, off, shape, stride)
    if extra is not None:
        p.str("extra")
        extra(p)
    p.b += b"u" if n > 1 else b"s" if n == 1 else b""
    if top == "ordered" and metadata:  # state_dict()'s _metadata attribute, set by BUILD
        p.b += b"}"
        p.put()
        p.str("_metadata")
        p.ordered_dict()
        p.str("")
        p.b += b"}"
        p.put()
        p.str("version")
        p.int(1)
        p.b += b"s"  # SETITEM
        p.b += b"s"
        p.b += b"s"
        p.b += b"b"  # BUILD
    p.b += b"."
    return bytes(p.b)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def write_zip(path, entries, archive="archive", compress=()):
    """A checkpoint by Python's zipfile: entries [(name, bytes)] under <archive>/, stored
    unless named in `compress`."""
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries:
            method = zipfile.ZIP_DEFLATED if name in compress else zipfile.ZIP_STORED
            z.writestr(f"{archive}/{name}", data, compress_type=method)
    return path


def write_torch_layout_zip(path, entries, archive="pytorch_model", zip64_extra=False):
    """A ZIP laid out as PyTorch's writer (miniz with the ZIP64 flag) lays it out: an 'FB'
    padding field in each local header aligning the data to 64 bytes, then the central
    directory, the ZIP64 end record, its locator and the end record. zip64_extra: sizes and
    offsets in ZIP64 extra fields of the central directory, as for entries past 4 GiB."""
    out, central = bytearray(), bytearray()
    for name, data in entries:
        full = f"{archive}/{name}".encode()
        ofs = len(out)
        pad = -(ofs + 30 + len(full) + 4) % 64
        extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
        crc = zlib.crc32(data)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 0, 0, 0, crc, len(data),
                           len(data), len(full), len(extra)) + full + extra + data
        assert (ofs + 30 + len(full) + len(extra)) % 64 == 0
        size, cofs, cx = len(data), ofs, b""
        if zip64_extra:
            size = cofs = 0xFFFFFFFF
            cx = struct.pack("<HHQQQ", 1, 24, len(data), len(data), ofs)
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 0, 0, 0, crc, size,
                               size, len(full), len(cx), 0, 0, 0, 0, cofs) + full + cx
    n, cd = len(entries), len(out)
    out += central
    e64 = len(out)
    out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, len(central), cd)
    out += struct.pack("<IIQI", 0x07064B50, 0, e64, 1)
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, len(central), cd, 0)
    path.write_bytes(bytes(out))
    return path


def checkpoint(tensors, storages, top="ordered", extra=None):
    """The entries of a checkpoint: data.pkl, version, byteorder and data/<key> for each
    storage {key: array}."""
    pkl = state_dict_pickle(tensors, top=top, extra=extra)
    return [("data.pkl", pkl), ("byteorder", b"little"), ("version", b"3\n")] + [
        (f"data/{k}", np.ascontiguousarray(a).tobytes()) for k, a in storages.items()]


@pytest.fixture
def three_types():
    rng = np.random.default_rng(7)
    a = rng.standard_normal(5).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float16)
    c = bf16_bits(rng.standard_normal((2, 3)))
    s = np.float32(2.5).reshape(())
    tensors = [("layers.0.a", "F32", "0", 5, 0, [5], None),
               ("fc.weight", "F16", "1", 12, 0, [3, 4], None),
               ("lm_head.weight", "BF16", "2", 6, 0, [2, 3], None),
               ("scale", "F32", "3", 1, 0, [], None)]
    return tensors, {"0": a, "1": b, "2": c, "3": s}


def check_values(got, tensors, storages):
    assert list(got) == [t[0] for t in tensors]
    for name, dt, key, _numel, off, shape, _stride in tensors:
        gdt, gshape, arr = got[name]
        want = storages[key].reshape(-1)[off:off + int(np.prod(shape))].reshape(shape)
        assert (gdt, gshape) == (dt, tuple(shape))
        assert arr.dtype == STORAGE[dt][1] and arr.shape == tuple(shape)
        assert arr.tobytes() == want.tobytes(), name


# The writer above against Python's own pickler, which torch.save uses: this script (run in a
# subprocess, so that its stand-in modules never meet the tests) pickles a state dict the way
# torch.save does (Tensor.__reduce_ex__ -> _rebuild_tensor_v2 with a plain size and stride
# tuple, requires_grad False and empty hooks; storages as persistent ids ('storage', class, key,
# 'cpu', numel); state_dict()'s _metadata attribute). The modules named torch and torch._utils
# in it are empty stand-ins holding only the names the pickle refers to.
REFERENCE_SAVER = r"""
import collections, io, json, pickle, sys, types
torch, utils = types.ModuleType("torch"), types.ModuleType("torch._utils")
def _rebuild_tensor_v2(*args): pass
_rebuild_tensor_v2.__module__ = "torch._utils"
utils._rebuild_tensor_v2, torch._utils = _rebuild_tensor_v2, utils
sys.modules.update({"torch": torch, "torch._utils": utils})
class Storage:
    def __init__(self, cls, key, numel): self.cls, self.key, self.numel = cls, key, numel
class Tensor:
    def __init__(self, *a): self.storage, self.offset, self.size, self.stride = a
    def __reduce_ex__(self, proto):
        return (_rebuild_tensor_v2, (self.storage, self.offset, tuple(self.size),
                                     tuple(self.stride), False, collections.OrderedDict()))
class Saver(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", obj.cls, obj.key, "cpu", obj.numel)
        return None
classes, storages, sd = {}, {}, collections.OrderedDict()
for name, cls_name, key, numel, off, shape, stride in json.loads(sys.argv[1]):
    if cls_name not in classes:
        classes[cls_name] = type(cls_name, (), {"__module__": "torch"})
        setattr(torch, cls_name, classes[cls_name])
    if key not in storages:
        storages[key] = Storage(classes[cls_name], key, numel)
    sd[name] = Tensor(storages[key], off, shape, stride)
sd._metadata = collections.OrderedDict([("", {"version": 1})])
buf = io.BytesIO()
Saver(buf, protocol=2).dump(sd)
sys.stdout.write(buf.getvalue().hex())
"""


@pytest.mark.parametrize("n", [6, 80])
def test_pickle_writer_matches_pythons_pickler(tmp_path, n):
    """The hand-written opcodes are byte for byte what Python's pickler writes for the same
    state dict, and the reader loads them. Tensors 2i and 2i + 1 share storage i: with 80 the
    memo passes 255 and the shared keys come back by LONG_BINGET."""
    dts = ["F32", "F16", "BF16"]
    tensors = [(f"h.{i}.w", dts[i // 2 % 3], str(i // 2), 8, 4 * (i % 2), [2, 2], None)
               for i in range(n)]
    spec = [(name, STORAGE[dt][0], key, numel, off, shape, [2, 1])
            for name, dt, key, numel, off, shape, _ in tensors]
    out = subprocess.run([sys.executable, "-c", REFERENCE_SAVER, json.dumps(spec)],
                         capture_output=True, text=True, check=True).stdout
    mine = state_dict_pickle(tensors)
    assert bytes.fromhex(out) == mine
    assert any(op.name == "LONG_BINGET" for op, _, _ in pickletools.genops(mine)) == (n > 40)
    rng = np.random.default_rng(n)
    storages = {str(i): rng.standard_normal(8).astype(np.float32) for i in range(n // 2)}
    storages = {k: a.astype(np.float16) if int(k) % 3 == 1 else bf16_bits(a) if int(k) % 3 == 2
                else a for k, a in storages.items()}
    p = write_zip(tmp_path / "many.bin", checkpoint(tensors, storages))
    check_values(_core.torch_bin_tensors(str(p)), tensors, storages)


# ---- what loads ----


@pytest.mark.parametrize("top", ["ordered", "dict"])
def test_f32_f16_bf16_load_exactly(tmp_path, three_types, top):
    tensors, storages = three_types
    p = write_zip(tmp_path / "pytorch_model.bin", checkpoint(tensors, storages, top=top))
    check_values(_core.torch_bin_tensors(str(p)), tensors, storages)


def test_torch_layout_zip64_and_aligned(tmp_path, three_types):
    tensors, storages = three_types
    for zip64_extra in (False, True):
        p = write_torch_layout_zip(tmp_path / f"m{zip64_extra}.bin",
                                   checkpoint(tensors, storages), zip64_extra=zip64_extra)
        with zipfile.ZipFile(p) as z:  # the writer is a ZIP by an independent reader
            assert z.read("pytorch_model/data/1") == storages["1"].tobytes()
        check_values(_core.torch_bin_tensors(str(p)), tensors, storages)


def test_shared_storage_and_offsets(tmp_path):
    """Several tensors viewing one storage at different offsets (torch.save keeps views
    shared), a size-1 dimension with any stride (contiguous in PyTorch's sense), an empty
    tensor, and integer and bool storages (EAGLE-3's d2t and t2d)."""
    s = np.arange(20, dtype=np.float32) * 0.5
    d2t = np.array([0, 5, -3, 2**40], np.int64)
    t2d = np.array([True, False, True], np.bool_)
    tensors = [("x", "F32", "0", 20, 0, [2, 3], None), ("y", "F32", "0", 20, 6, [4], None),
               ("z", "F32", "0", 20, 10, [2, 1, 5], [5, 7, 1]),
               ("empty", "F32", "0", 20, 20, [0, 3], None),
               ("d2t", "I64", "1", 4, 0, [4], None), ("t2d", "BOOL", "2", 3, 0, [3], None)]
    storages = {"0": s, "1": d2t, "2": t2d}
    p = write_zip(tmp_path / "shared.pt", checkpoint(tensors, storages))
    got = _core.torch_bin_tensors(str(p))
    check_values(got, tensors, storages)
    assert got["z"][2].tolist() == [[s[10:15].tolist()], [s[15:20].tolist()]]


def test_any_file_opens_by_content(tmp_path, three_types):
    """A .safetensors and a .bin holding the same tensors read alike (the head loaders' one
    entry point, sd_tensor_set_open_file)."""
    tensors, storages = three_types
    binp = write_zip(tmp_path / "medusa_lm_head.pt", checkpoint(tensors, storages))
    header, data = {}, b""
    for name, dt, key, _n, _o, shape, _s in tensors:
        raw = storages[key].tobytes()
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data),
                                                                      len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    stp = tmp_path / "medusa_lm_head.safetensors"
    stp.write_bytes(struct.pack("<Q", len(h)) + h + data)
    a, b = _core.tensor_file_tensors(str(binp)), _core.tensor_file_tensors(str(stp))
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k][:2] == b[k][:2] and a[k][2].tobytes() == b[k][2].tobytes()


# ---- what is refused ----


def evil_call(module, name, arg):
    """A dict value that calls module.name(arg) under pickle.loads."""
    def write(p):
        p.b += b"c" + f"{module}\n{name}\n".encode()
        p.str(arg)
        p.b += b"\x85R"  # TUPLE1 REDUCE
    return write


@pytest.mark.parametrize("module,name", [("os", "system"), ("builtins", "eval"),
                                         ("posix", "system"), ("__builtin__", "open"),
                                         ("torch", "load"), ("collections", "namedtuple")])
def test_foreign_global_refused(tmp_path, three_types, module, name):
    tensors, storages = three_types
    p = write_zip(tmp_path / "m.bin",
                  checkpoint(tensors, storages, extra=evil_call(module, name, "echo hi")))
    with pytest.raises(ValueError, match=rf"refused: the pickle calls {module}\.{name};"):
        _core.torch_bin_tensors(str(p))


def test_stack_global_refused(tmp_path):
    pkl = b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x02hi\x85R."
    p = write_zip(tmp_path / "m.bin", [("data.pkl", pkl)])
    with pytest.raises(ValueError, match=r"calls os\.system"):
        _core.torch_bin_tensors(str(p))


class Touch:
    """Under pickle.loads, creates the file `path` (builtins.open(path, 'w'))."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("where", ["whole", "inside"])
def test_malicious_pickle_runs_nothing(tmp_path, three_types, where):
    """A pickle that creates a file when pickle.loads runs it is refused, and the file is not
    created. The payload is shown to work on a decoy path first."""
    decoy, target = tmp_path / "decoy", tmp_path / "pwned"
    pickle.loads(pickle.dumps(Touch(decoy), protocol=2))
    assert decoy.exists()
    payload = pickle.dumps({"w": Touch(target)}, protocol=2)
    if where == "whole":
        entries = [("data.pkl", payload)]
    else:
        tensors, storages = three_types
        entries = checkpoint(tensors, storages, extra=evil_call("builtins", "open", str(target)))
    p = write_zip(tmp_path / "evil.bin", entries)
    with pytest.raises(ValueError, match=r"refused: the pickle calls (io|builtins)\.open"):
        _core.torch_bin_tensors(str(p))
    assert not target.exists()


def refuse(tmp_path, entries, match, **kw):
    p = write_zip(tmp_path / "m.bin", entries, **kw)
    with pytest.raises(ValueError, match=match):
        _core.torch_bin_tensors(str(p))


@pytest.mark.parametrize("op,match", [
    (b"i", r"refused: the pickle uses INST"), (b"o", r"refused: the pickle uses OBJ"),
    (b"\x81", r"refused: the pickle uses NEWOBJ"), (b"\x82", r"uses EXT1"),
    (b"\xff", r"unknown pickle opcode 0xff"), (b"2", r"opcode DUP")])
def test_opcodes_refused(tmp_path, op, match):
    refuse(tmp_path, [("data.pkl", b"\x80\x02}q\x00" + op + b"\x00\x00.")], match)


def test_storage_class_may_not_be_called(tmp_path):
    pkl = b"\x80\x02ctorch\nFloatStorage\n)R."
    refuse(tmp_path, [("data.pkl", pkl)], r"refused: the pickle calls torch\.FloatStorage")


def test_non_contiguous_refused(tmp_path):
    t = [("w", "F32", "0", 6, 0, [2, 3], [1, 2])]
    refuse(tmp_path, checkpoint(t, {"0": np.zeros(6, np.float32)}), r"'w' is not contiguous")


@pytest.mark.parametrize("off,shape", [(4, [2, 2]), (0, [7]), (2**40, [1])])
def test_extent_beyond_storage_refused(tmp_path, off, shape):
    t = [("w", "F32", "0", 6, off, shape, None)]
    refuse(tmp_path, checkpoint(t, {"0": np.zeros(6, np.float32)}),
           r"tensor 'w' covers elements .* which holds only 6")


def test_storage_size_mismatch_refused(tmp_path):
    t = [("w", "F32", "0", 8, 0, [6], None)]
    refuse(tmp_path, checkpoint(t, {"0": np.zeros(6, np.float32)}), r"holds 24 bytes")


def test_missing_storage_refused(tmp_path, three_types):
    tensors, storages = three_types
    entries = [e for e in checkpoint(tensors, storages) if e[0] != "data/2"]
    refuse(tmp_path, entries, r"no entry data/2")


def test_missing_data_pkl_refused(tmp_path, three_types):
    tensors, storages = three_types
    entries = [e for e in checkpoint(tensors, storages) if e[0] != "data.pkl"]
    refuse(tmp_path, entries, r"no <archive>/data.pkl entry")


def test_compressed_entry_refused(tmp_path, three_types):
    tensors, storages = three_types
    refuse(tmp_path, checkpoint(tensors, storages), r"'archive/data/1' is compressed .*deflate",
           compress=("data/1",))


def test_not_a_zip_refused(tmp_path):
    p = tmp_path / "legacy.bin"
    p.write_bytes(pickle.dumps({"a": 1}, protocol=2))
    with pytest.raises(ValueError, match=r"legacy torch.save format"):
        _core.torch_bin_tensors(str(p))
    with pytest.raises(OSError, match="nothere"):
        _core.torch_bin_tensors(str(tmp_path / "nothere.bin"))


def test_truncated_zip_refused_at_every_length(tmp_path, three_types):
    tensors, storages = three_types
    data = write_zip(tmp_path / "m.bin", checkpoint(tensors, storages)).read_bytes()
    p = tmp_path / "cut.bin"
    for n in range(len(data)):
        p.write_bytes(data[:n])
        with pytest.raises(ValueError):
            _core.torch_bin_tensors(str(p))
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"truncated"):
        _core.torch_bin_tensors(str(p))


def central_directory(data: bytes):
    """(offset of the central directory, [offsets of its headers])."""
    eocd = data.rindex(b"PK\x05\x06")
    n, _size, cd = struct.unpack_from("<HII", data, eocd + 10)
    offs, p = [], cd
    for _ in range(n):
        offs.append(p)
        nl, xl, cl = struct.unpack_from("<HHH", data, p + 28)
        p += 46 + nl + xl + cl
    return cd, offs


def test_overlapping_and_out_of_range_entries_refused(tmp_path, three_types):
    tensors, storages = three_types
    data = bytearray(write_zip(tmp_path / "m.bin", checkpoint(tensors, storages)).read_bytes())
    cd, offs = central_directory(bytes(data))
    p = tmp_path / "bad.bin"
    # the central directory lists its last entry twice: the two overlap
    eocd = data.rindex(b"PK\x05\x06")
    last = bytes(data[offs[-1]:eocd])
    dup = data[:eocd] + last + data[eocd:]
    n, size, _ = struct.unpack_from("<HII", dup, eocd + len(last) + 10)
    struct.pack_into("<HHI", dup, eocd + len(last) + 8, n + 1, n + 1, size + len(last))
    p.write_bytes(bytes(dup))
    with pytest.raises(ValueError, match=r"'archive/data/3' and 'archive/data/3' overlap"):
        _core.torch_bin_tensors(str(p))
    # an entry's local header offset past the data
    bad = bytearray(data)
    struct.pack_into("<I", bad, offs[1] + 42, cd + 5)
    p.write_bytes(bytes(bad))
    with pytest.raises(ValueError, match=r"no local header at byte \d+ \(out of range"):
        _core.torch_bin_tensors(str(p))
    # an entry's size running into the central directory
    bad = bytearray(data)
    struct.pack_into("<II", bad, offs[-1] + 20, 10**6, 10**6)
    p.write_bytes(bytes(bad))
    with pytest.raises(ValueError, match=r"runs past the start of the central directory"):
        _core.torch_bin_tensors(str(p))


def test_mutated_pickles_never_crash(tmp_path, three_types):
    """Every truncation and 400 random byte changes of a valid data.pkl load or raise
    ValueError, never crash (and whatever loads holds only tensors)."""
    tensors, storages = three_types
    entries = checkpoint(tensors, storages)
    pkl = entries[0][1]
    rng = random.Random(3)
    variants = [pkl[:n] for n in range(len(pkl))]
    for _ in range(400):
        b = bytearray(pkl)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        variants.append(bytes(b))
    p = tmp_path / "m.bin"
    for v in variants:
        write_zip(p, [("data.pkl", v)] + entries[1:])
        try:
            got = _core.torch_bin_tensors(str(p))
        except ValueError:
            continue
        assert all(isinstance(a, np.ndarray) for _, _, a in got.values())


def test_no_torch_import():
    assert "torch" not in sys.modules
