"""A Spark file-source query over a journal directory sees whole fragments only, hence whole frames."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from journal_helpers import ndjson

from zcluster.journal import FileJournals
from zcluster.journal._filefmt import OPEN_NAME

pytestmark = pytest.mark.spark


def test_available_now_query_reads_only_whole_fragments(tmp_path: Path) -> None:
    from zcluster.spark import local_session

    root = tmp_path / "journals"
    with FileJournals(root, fragment_bytes=600) as fj:
        fj.create(ndjson("pv/part-000"))
        for i in range(100):
            fj.append("pv/part-000", json.dumps({"i": i, "pad": "x" * (i % 13)}).encode() + b"\n")
        # An append in progress (torn, as if its writer were mid-write) and a fragment being written.
        (root / "pv/part-000" / ".tmp-00000000000000099999-00000000000000100000.frag").write_bytes(b'{"torn":')
        with open(root / "pv/part-000" / OPEN_NAME, "ab") as f:
            f.write(b"\x00\x00\x01\x00garbage")
        named = re.compile(r"\d{20}-\d{20}(-[0-9a-f]{8})?\.frag")
        frags = sorted(p for p in (root / "pv/part-000").iterdir() if named.fullmatch(p.name))
        whole = b"".join(p.read_bytes() for p in frags)
        in_open = fj.end("pv/part-000") - len(whole)
    assert len(frags) >= 3 and in_open > 0  # some data is still in the open (invisible) fragment

    spark = local_session("local[1]", "zcluster-journal-test")
    try:
        stream = spark.readStream.format("text").load(str(root / "pv/part-000"))
        query = (
            stream.writeStream.format("memory")
            .queryName("frames")
            .trigger(availableNow=True)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .start()
        )
        query.awaitTermination(120)
        lines = [r.value for r in spark.sql("select value from frames").collect()]
    finally:
        spark.stop()
    docs = [json.loads(line) for line in lines]  # every line is a whole frame
    assert sorted(d["i"] for d in docs) == list(range(len(docs)))
    assert sorted(line.encode() + b"\n" for line in lines) == sorted(whole.splitlines(keepends=True))
