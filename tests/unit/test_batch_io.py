"""Batch input parsing and the resumable output file, on real files (no server needed)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from clients.batch.input import count_records, detect_format, read_records
from clients.batch.output import OutputLog, ResumeFilter, id_key


def test_jsonl_ids_and_malformed_lines_become_failed_records(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join([
        b'{"id": "a", "text": "first"}',          # 1: given id
        b'{"text": "second", "text_pair": "p"}',  # 2: id = line number
        b"",                                      # 3: blank, skipped
        b"{not json",                             # 4
        b"[1, 2]",                                # 5: not an object
        b'{"id": "b"}',                           # 6: no text
        b'{"id": 1.5, "text": "x"}',              # 7: bad id type
        b'{"text": "\xff\xfe"}',                  # 8: not UTF-8
        b'{"id": 9, "text": 3}',                  # 9: text not a string
    ]) + b"\n")
    records = list(read_records(path, "jsonl", "classify"))
    assert [(r.line, r.id) for r in records] == [(1, "a"), (2, 2), (4, 4), (5, 5), (6, "b"), (7, 7), (8, 8), (9, 9)]
    assert records[0].text == "first" and records[0].text_pair is None and records[0].error is None
    assert records[1].text_pair == "p"
    errors = [r.error for r in records[2:]]
    assert errors[0].startswith("input line 4: not valid JSON")
    assert errors[1] == "input line 5: expected a JSON object, got list"
    assert errors[2] == "text: missing"
    assert errors[3].startswith("id: must be")
    assert errors[4] == "input line 8: not valid UTF-8"
    assert errors[5] == "text: must be a string, got int"
    assert count_records(path, "jsonl", "classify") == 8


def test_generate_accepts_prompt_field(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "Once"}\n{"text": "Twice"}\n')
    assert [r.text for r in read_records(path, "jsonl", "generate")] == ["Once", "Twice"]


def test_csv_header_multiline_field_and_short_row(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text('id,text,text_pair\nx1,hello,\n,"two\nlines",pair\nonly-one-field\n')
    records = list(read_records(path, "csv", "classify"))
    assert [(r.line, r.id) for r in records] == [(2, "x1"), (3, 3), (5, 5)]
    assert records[0].text_pair is None
    assert records[1].text == "two\nlines" and records[1].text_pair == "pair"
    assert records[2].error == "input line 5: expected 3 CSV fields, got 1"
    assert count_records(path, "csv", "classify") == 3


def test_csv_without_text_column_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="header needs a 'text' column"):
        list(read_records(path, "csv", "classify"))


def test_text_lines_are_ids_by_line_number(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_text("alpha\n\n  \nbeta\r\ngamma")
    records = list(read_records(path, detect_format(path, None), "fill-mask"))
    assert [(r.id, r.text) for r in records] == [(1, "alpha"), (4, "beta"), (5, "gamma")]


def test_output_log_drops_partial_last_line_and_resumes(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    complete = '{"id": 1, "label": "a"}\n{"id": "x", "error": "INVALID_ARGUMENT: text: empty"}\n'
    path.write_text(complete + '{"id": 3, "lab')  # as left by kill -9 in the middle of a write
    out = OutputLog(path)
    assert path.read_text() == complete
    assert out.done == Counter({id_key(1): 1, id_key("x"): 1})
    assert out.written_before == 2 and out.failed_before == 1
    out.write(3, {"label": "b"})
    out.close()
    assert path.read_text() == complete + '{"id": 3, "label": "b"}\n'


def test_output_log_refuses_a_foreign_file(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text("this is not ours\n")
    with pytest.raises(ValueError, match="line 1 .* is not JSON"):
        OutputLog(path)
    assert path.read_text() == "this is not ours\n"


def test_resume_filter_counts_repeated_ids() -> None:
    # The output holds id 7 once and "7" (a different id) once.
    done = Counter({json.dumps(7): 1, json.dumps("7"): 1})
    f = ResumeFilter(done)
    assert [f.already_written(i) for i in (7, "7", 7, 8)] == [True, True, False, False]


def test_a_generation_payload_is_what_dataclasses_asdict_writes() -> None:
    """The payload is written field by field (asdict's recursive copy was a tenth of the loop in short jobs): the
    same keys, order and values as asdict of the client's dataclasses, so outputs stay byte for byte comparable."""
    from dataclasses import asdict

    from clients.batch.tasks import generation_payload
    from clients.types import GeneratedToken, Generation, TokenLogprob, Usage

    tokens = [GeneratedToken(5, -0.25, [TokenLogprob(5, "a", -0.25), TokenLogprob(9, "b", -1.5)]), GeneratedToken(2)]
    result = Generation("ab", "eos", Usage(3, 2, 1), tokens, model="m", version=1, time_to_first_token_ms=4.0,
                        prompt_tokens=[GeneratedToken(1), GeneratedToken(7, -2.0)])
    want = {"text": "ab", "finish_reason": "eos", "usage": asdict(result.usage),
            "tokens": [asdict(t) for t in tokens], "prompt_tokens": [asdict(t) for t in result.prompt_tokens]}
    assert json.dumps(generation_payload(result, with_tokens=True)) == json.dumps(want)
    without = {k: v for k, v in want.items() if k != "tokens"}
    assert json.dumps(generation_payload(result, with_tokens=False)) == json.dumps(without)
