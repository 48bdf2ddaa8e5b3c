"""SPECDEC_REQUIRE: a test that would skip because something is missing (helpers.missing, or the
`requires` marker of conftest.py) fails instead, with the same reason, when the variable names
that thing; unknown names are refused. Checked by running pytest in a child process, on a small
test file written here and on the suite's own skip sites."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from helpers import HERE, REQUIRABLE, child_env
from specdec import _core

PROBE = '''
import pytest
import helpers


def test_calls_missing():
    helpers.missing("cuda", "no GPU in this probe")


@pytest.mark.requires("amx", "no AMX in this probe")
def test_marked_missing():
    pass


@pytest.mark.requires("avx2", "")
def test_marked_present():
    pass
'''


def run_pytest(args: list, require: str | None, **env) -> tuple[int, str]:
    """pytest in a child process with tests/conftest.py loaded as a plugin (so the `requires`
    marker works on files outside tests/); returns (exit code, output)."""
    env = dict(env)
    if require is not None:
        env["SPECDEC_REQUIRE"] = require
    e = child_env(**env)
    e["PYTHONPATH"] = os.pathsep.join([HERE, e["PYTHONPATH"]])
    if require is None:
        e.pop("SPECDEC_REQUIRE", None)
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rsf", "-p", "conftest",
                          "-p", "no:cacheprovider", *args], capture_output=True, text=True,
                         timeout=300, cwd=HERE, env=e)
    return res.returncode, res.stdout + res.stderr


def outcomes(out: str) -> dict:
    """{"passed": n, "failed": n, "skipped": n} from pytest's closing line (zeros left out; a
    failure in a fixture or setup, which pytest calls an error, counts as failed)."""
    got: dict = {}
    for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", out.splitlines()[-1]):
        k = "failed" if k.startswith("error") else k
        got[k] = got.get(k, 0) + int(n)
    return got


@pytest.fixture()
def probe(tmp_path):
    path = tmp_path / "test_probe.py"
    path.write_text(PROBE)
    return str(path)


def test_missing_things_skip_with_their_reasons(probe):
    code, out = run_pytest([probe], None)
    assert code == 0, out
    assert outcomes(out) == {"passed": 1, "skipped": 2}, out
    assert "SKIPPED" in out and "no GPU in this probe" in out and "no AMX in this probe" in out


def test_required_things_fail_with_the_same_reasons(probe):
    code, out = run_pytest([probe], "cuda")
    assert code == 1, out
    assert outcomes(out) == {"passed": 1, "failed": 1, "skipped": 1}, out
    assert "no GPU in this probe (SPECDEC_REQUIRE names cuda)" in out
    code, out = run_pytest([probe], " AMX , cuda")  # case and spaces do not matter
    assert outcomes(out) == {"passed": 1, "failed": 2}, out
    assert "no AMX in this probe (SPECDEC_REQUIRE names amx)" in out


def test_unknown_names_are_refused(probe):
    code, out = run_pytest([probe], "cuda,gpu,avx")
    assert code == 4, out  # pytest's usage error: nothing ran
    assert "SPECDEC_REQUIRE names avx, gpu, which the tests do not know" in out
    for name in REQUIRABLE:
        assert name in out


def test_missing_rejects_an_unknown_thing():
    from helpers import missing

    with pytest.raises(ValueError, match="unknown requirement 'gpu'"):
        missing("gpu", "a typo in a test")


def test_the_smollm2_fixture_fails_when_required(tmp_path):
    """The suite's own skip site for the real model: a file that is not there skips the
    SmolLM2 tests, or fails them when SPECDEC_REQUIRE names smollm2."""
    gone = str(tmp_path / "no-such-model.gguf")
    args = ["test_tokenizer.py", "-k", "test_smollm2_tokenizer"]
    code, out = run_pytest(args, None, SPECDEC_SMOLLM2_GGUF=gone)
    assert code == 0 and outcomes(out) == {"skipped": 1}, out
    code, out = run_pytest(args, "smollm2", SPECDEC_SMOLLM2_GGUF=gone)
    assert code == 1 and outcomes(out) == {"failed": 1}, out
    assert f"SPECDEC_SMOLLM2_GGUF={gone} is not a file (SPECDEC_REQUIRE names smollm2)" in out


# The suite's other skip sites, each with a thing some machines lack: one test of each.
SITES = {"cuda": ("test_cuda.py", "test_swiglu", ""),
         "avx512": ("test_twins.py", "test_attention_avx512_gives_the_avx2_bits", "avx512"),
         "avxvnni": ("test_quant.py", "test_avxvnni_tile_gives_the_vnni_bits", "avxvnni"),
         "vnni": ("test_quant.py", "test_sixteen_row_tile_gives_the_eight_row_bits", "avx512vnni"),
         "amx": ("test_quant.py", "test_amx_tiles_give_the_vnni_bits", "amx")}


def _lacks(thing: str) -> bool:
    if thing == "cuda":
        return not _core.built_with_cuda() or _core.cuda_probe()["devices"] == 0
    if thing == "avxvnni":  # below AVX-512, where the kernels stop when capped at it
        from helpers import child_json

        code = "import json; from specdec import _core; print(json.dumps(_core.simd_name()))"
        return "avxvnni" not in child_json(code, SPECDEC_SIMD="avxvnni")
    return SITES[thing][2] not in _core.simd_name()


LACKING = [t for t in SITES if _lacks(t)]


def test_the_suite_routes_its_skips_through_missing():
    """For what this machine lacks, the suite's own test fails when it is required (a site
    that called pytest.skip directly would still skip). Where a machine lacks none of them,
    the probe tests above still check the mechanism."""
    for thing in LACKING:
        path, name, _ = SITES[thing]
        code, out = run_pytest([path, "-k", name], thing)
        assert code == 1 and "failed" in outcomes(out) and "skipped" not in outcomes(out), out
        assert f"(SPECDEC_REQUIRE names {thing})" in out, out
