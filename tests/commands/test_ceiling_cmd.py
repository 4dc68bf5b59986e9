"""``vllm-triage ceiling`` end to end, through a test-local argparse entry point, and once
as the installed command from another directory."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from vllm_triage.commands.ceiling import add_parser

from support.captures import SEED_CEILINGS
from support.clirun import vllm_triage
from support.paths import CONFIGS

LLAMA = CONFIGS / "llama-3.1-8b.json"


def parser() -> argparse.ArgumentParser:
    """What vllm_triage.cli's ``main()`` builds: a parser with ``ceiling`` as a subcommand."""
    p = argparse.ArgumentParser(prog="vllm-triage")
    add_parser(p.add_subparsers(dest="command", required=True))
    return p


def cli(*argv: str | Path) -> int:
    args = parser().parse_args(["ceiling", *map(str, argv)])
    code: int = args.func(args)
    return code


def json_rows(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> list[dict[str, Any]]:
    assert cli(*argv, "--format", "json") == 0
    rows: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return rows


class TestJSON:
    @pytest.mark.parametrize(
        ("gpu", "ceiling"), list(SEED_CEILINGS.items()), ids=list(SEED_CEILINGS)
    )
    def test_reproduces_seed_table(
        self, capsys: pytest.CaptureFixture[str], gpu: str, ceiling: int
    ) -> None:
        """8B at float16 gives the seed's ceiling for each of its six devices."""
        rows = json_rows(capsys, "--parameters-billion", "8", "--dtype", "float16")
        row = next(r for r in rows if r["gpu"] == gpu)
        assert round(row["decode_ceiling_tokens_per_s"]) == ceiling

    def test_one_object_per_gpu_with_keys(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The output is a list with one object per GPU carrying the documented keys."""
        rows = json_rows(capsys, "--parameters-billion", "8")
        assert len(rows) >= 24
        for row in rows:
            assert {"gpu", "memory_bandwidth_gb_s", "decode_ceiling_tokens_per_s"} <= set(row)
            assert {"weight_bytes_per_token", "parameters_billion", "dtype", "source"} <= set(row)
            assert "kv_bytes_per_token" not in row
            assert row["dtype"] == "float16"

    def test_config_json_adds_kv(self, capsys: pytest.CaptureFixture[str]) -> None:
        """With --config-json every row carries kv_bytes_per_token (131072 for Llama 3.1 8B)."""
        rows = json_rows(capsys, "--config-json", LLAMA)
        assert {r["kv_bytes_per_token"] for r in rows} == {131072}
        assert {r["dtype"] for r in rows} == {"bfloat16"}

    def test_config_directory_accepted(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """A model directory is read through its config.json."""
        (tmp_path / "config.json").write_text(LLAMA.read_text(encoding="utf-8"), encoding="utf-8")
        rows = json_rows(capsys, "--config-json", tmp_path, "--gpu", "h100")
        assert rows[0]["kv_bytes_per_token"] == 131072

    def test_kv_cache_dtype(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--kv-cache-dtype fp8 halves the KV bytes per token."""
        rows = json_rows(capsys, "--config-json", LLAMA, "--kv-cache-dtype", "fp8", "--gpu", "l4")
        assert rows[0]["kv_bytes_per_token"] == 65536

    def test_single_gpu_by_alias(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--gpu keeps only the matching row, found by alias."""
        rows = json_rows(capsys, "--parameters-billion", "8", "--gpu", "H100-SXM5-80GB")
        assert [r["gpu"] for r in rows] == ["NVIDIA H100 SXM"]
        assert rows[0]["decode_ceiling_tokens_per_s"] == 209.38

    def test_tensor_parallel_and_fraction(self, capsys: pytest.CaptureFixture[str]) -> None:
        """TP=2 doubles and a 0.5 achievable fraction halves the ceiling."""
        rows = json_rows(
            capsys,
            *("--parameters-billion", "8", "--gpu", "h100"),
            *("--tensor-parallel-size", "2", "--achievable-fraction", "0.5"),
        )
        assert rows[0]["decode_ceiling_tokens_per_s"] == 209.38

    def test_int4_doubles_fp8(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The dtype flag changes bytes per weight: int4 doubles the fp8 ceiling."""
        fp8 = json_rows(capsys, "--parameters-billion", "70", "--dtype", "fp8", "--gpu", "h200")
        int4 = json_rows(capsys, "--parameters-billion", "70", "--dtype", "int4", "--gpu", "h200")
        assert int4[0]["decode_ceiling_tokens_per_s"] == pytest.approx(
            2 * fp8[0]["decode_ceiling_tokens_per_s"], abs=0.01
        )


class TestText:
    def test_table_with_header(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Text output names the model size and lists each GPU with its rounded ceiling."""
        assert cli("--parameters-billion", "8") == 0
        out = capsys.readouterr().out
        lines = out.splitlines()
        assert "8.00B parameters" in lines[0]
        assert "16.00 GB of weights read per token" in lines[0]
        for gpu, ceiling in SEED_CEILINGS.items():
            row = next(line for line in lines if line.startswith(gpu + " "))
            assert row.split()[-1] == str(ceiling)
        assert "KV cache" not in out

    def test_columns_aligned(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Table rows share one width, so the numbers line up under the header."""
        assert cli("--parameters-billion", "8") == 0
        lines = capsys.readouterr().out.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("GPU "))
        table = lines[start : start + 7]
        assert len({len(line) for line in table}) == 1

    def test_kv_line_and_notes_from_config(self, capsys: pytest.CaptureFixture[str]) -> None:
        """With a config.json the header gives KV bytes per token and the counting notes."""
        assert cli("--config-json", LLAMA, "--gpu", "a100") == 0
        out = capsys.readouterr().out
        assert "KV cache: 131,072 bytes per token (128.0 KiB)" in out
        assert "note: input embedding table" in out

    def test_help_has_examples(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--help explains the ceiling and shows example command lines."""
        with pytest.raises(SystemExit) as exit_info:
            parser().parse_args(["ceiling", "--help"])
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        assert "vllm-triage ceiling --parameters-billion 8" in out
        assert "--config-json" in out


class TestErrors:
    @pytest.mark.parametrize(
        "argv",
        [(), ("--parameters-billion", "8", "--config-json", str(LLAMA))],
        ids=["neither", "both"],
    )
    def test_exactly_one_model_source(
        self, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
    ) -> None:
        """Without exactly one of --parameters-billion / --config-json: stderr, exit 2."""
        assert cli(*argv) == 2
        captured = capsys.readouterr()
        assert "exactly one of --parameters-billion or --config-json" in captured.err
        assert captured.out == ""

    @pytest.mark.parametrize(
        ("content", "expected"),
        [
            ("{not json", "not valid JSON"),
            ("[1, 2]", "must hold a JSON object"),
            ('{"hidden_size": 8}', "missing required key"),
            (b"\xff\xfe", "not UTF-8"),
        ],
        ids=["invalid-json", "not-object", "missing-key", "not-utf8"],
    )
    def test_bad_config_file(
        self,
        capsys: pytest.CaptureFixture[str],
        tmp_path: Path,
        content: str | bytes,
        expected: str,
    ) -> None:
        """A bad config.json gives one line on stderr naming the file, exit 2, no traceback."""
        path = tmp_path / "config.json"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        assert cli("--config-json", path) == 2
        err = capsys.readouterr().err
        assert str(path) in err
        assert expected in err
        assert "Traceback" not in err

    def test_missing_file(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """An unreadable path is reported, not raised."""
        assert cli("--config-json", tmp_path / "absent.json") == 2
        assert "cannot read" in capsys.readouterr().err

    @pytest.mark.parametrize(
        ("argv", "expected"),
        [
            (("--parameters-billion", "8", "--gpu", "Voodoo 3"), "unknown GPU 'Voodoo 3'"),
            (("--parameters-billion", "8", "--dtype", "int3"), "unknown dtype 'int3'"),
            (("--parameters-billion", "8", "--kv-cache-dtype", "fp8"), "needs --config-json"),
        ],
        ids=["gpu", "dtype", "kv-without-config"],
    )
    def test_user_errors(
        self, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], expected: str
    ) -> None:
        """Unknown names and impossible combinations: message on stderr, exit 2."""
        assert cli(*argv) == 2
        assert expected in capsys.readouterr().err

    @pytest.mark.parametrize(
        "argv",
        [
            ("--achievable-fraction", "0"),
            ("--achievable-fraction", "1.5"),
            ("--tensor-parallel-size", "0"),
            ("--parameters-billion", "-8"),
            ("--format", "yaml"),
        ],
        ids=["fraction-0", "fraction-1.5", "tp-0", "negative-size", "format"],
    )
    def test_out_of_range_flags(
        self, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
    ) -> None:
        """Values outside their range are refused by argparse with exit status 2."""
        with pytest.raises(SystemExit) as exit_info:
            parser().parse_args(["ceiling", "--parameters-billion", "8", *argv])
        assert exit_info.value.code == 2
        assert "error" in capsys.readouterr().err


class TestTheInstalledCommand:
    def test_seed_table_from_any_directory(self, tmp_path: Path) -> None:
        """`ceiling --parameters-billion 8 --dtype float16` reproduces the seed's table."""
        result = vllm_triage(
            "ceiling",
            "--parameters-billion",
            "8",
            "--dtype",
            "float16",
            "--format",
            "json",
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        rows = {row["gpu"]: row for row in json.loads(result.stdout)}
        assert {
            gpu: round(rows[gpu]["decode_ceiling_tokens_per_s"]) for gpu in SEED_CEILINGS
        } == SEED_CEILINGS
        assert all(
            {"gpu", "memory_bandwidth_gb_s", "decode_ceiling_tokens_per_s"} <= r.keys()
            for r in rows.values()
        )

    def test_config_json_adds_kv_bytes(self, tmp_path: Path) -> None:
        """`ceiling --config-json` adds kv_bytes_per_token: 131072 for the 8B layout."""
        cfg = CONFIGS / "llama-3.1-8b.json"
        result = vllm_triage("ceiling", "--config-json", str(cfg), "--format", "json", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert {row["kv_bytes_per_token"] for row in json.loads(result.stdout)} == {131072}
