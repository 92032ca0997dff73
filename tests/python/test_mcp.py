"""Memory Tracer's MCP tools, driven by the official `mcp` Python client: `collector mcp` over
stdio and `/mcp` on `collector serve` (streamable HTTP, behind the token). Each tool is called
on a real sample and its answer compared with the CLI's `--json`; a trace that is not there,
a path outside the allowed folders, and a request without the token are refused."""

import asyncio
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

import memory_tracer

import mcp  # noqa: E402  (pip install memory_tracer[mcp])
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.realpath(os.path.join(HERE, "..", "data"))
SNAPSHOT = os.path.join(DATA, "resnet18_sgd_2steps.pickle")
OTHER = os.path.join(DATA, "mlp_adam_3steps.pickle")
TOOLS = {"summary", "top_allocations_at_peak", "layer_stats", "leaks", "oom", "diff", "advise", "find", "whatif", "why", "ledger"}
LEDGER = os.path.join(DATA, "ledger", "probe.mtrace.json.gz")


def cli_json(*args):
    r = subprocess.run([memory_tracer.collector_path(), *args, "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def answer(result):
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)


async def exercise(session, trace, other):
    """Calls every tool on `trace` (and `other` for diff) and checks each against the CLI."""
    listed = await session.list_tools()
    assert {t.name for t in listed.tools} == TOOLS
    for t in listed.tools:
        assert t.description and "trace" in json.dumps(t.input_schema) or t.name == "diff"

    summary = answer(await session.call_tool("summary", {"trace": trace}))
    cli = cli_json("summary", SNAPSHOT)
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "total_events", "peak_layer"):
        assert summary[key] == cli[key], key
    assert summary["categories_at_peak"] == cli["categories_at_peak"]
    assert len(json.dumps(summary)) < 4000, "a summary is small"

    top = answer(await session.call_tool("top_allocations_at_peak", {"trace": trace, "limit": 5}))
    assert 0 < len(top) <= 5
    sizes = [a["size_bytes"] for a in top]
    assert sizes == sorted(sizes, reverse=True) and sum(sizes) <= cli["peak_allocated_bytes"]

    layers = answer(await session.call_tool("layer_stats", {"trace": trace, "limit": 3}))
    assert [l["layer_name"] for l in layers] == [l["layer_name"] for l in cli["top_layers"][:3]]
    one = answer(await session.call_tool("layer_stats", {"trace": trace, "layer": layers[0]["layer_name"]}))
    assert one == layers[:1]

    leaks = answer(await session.call_tool("leaks", {"trace": trace}))
    cli_leaks = cli_json("leaks", SNAPSHOT)
    assert (leaks["leaking"], leaks["allocated_at_end_bytes"]) == (cli_leaks["leaking"], cli_leaks["allocated_at_end_bytes"])

    oom = answer(await session.call_tool("oom", {"trace": trace}))
    assert oom == {"out_of_memory": False}

    advice = answer(await session.call_tool("advise", {"trace": trace, "budget": "200MiB"}))
    cli_advice = cli_json("advise", SNAPSHOT, "--budget", "200MiB", "--top", "5")
    assert [s["kind"] for s in advice["suggestions"]] == [s["kind"] for s in cli_advice["suggestions"]]

    found = answer(await session.call_tool("find", {"trace": trace, "query": "conv1", "limit": 3}))
    cli_found = cli_json("find", SNAPSHOT, "conv1", "--limit", "3")
    assert found["total"] == cli_found["total"] and len(found["matches"]) <= 3

    diff = answer(await session.call_tool("diff", {"a": other, "b": trace, "limit": 4}))
    cli_diff = cli_json("diff", OTHER, SNAPSHOT)
    assert diff["b"]["peak_allocated_bytes"] == cli_diff["b"]["peak_allocated_bytes"]
    assert len(diff["layers"]) <= 4

    settings = ["expandable_segments:True", "roundup_power2_divisions:4"]
    whatif = answer(await session.call_tool("whatif", {"trace": trace, "alloc_conf": settings, "device_memory": "1GiB"}))
    cli_whatif = cli_json("whatif", SNAPSHOT, *[a for s in settings for a in ("--alloc-conf", s)], "--device-memory", "1GiB")
    assert whatif == cli_whatif and [s["alloc_conf"] for s in whatif["settings"]] == [""] + settings
    assert whatif["settings"][0]["reserved_peak_bytes"] == cli["peak_reserved_bytes"]
    bad = await session.call_tool("whatif", {"trace": trace, "alloc_conf": ["expandable_segment:True"]})
    assert bad.is_error and "expandable_segment" in bad.content[0].text

    if trace == SNAPSHOT:
        ledger = answer(await session.call_tool("ledger", {"trace": LEDGER, "at": "held"}))
        assert ledger == cli_json("ledger", LEDGER, "--at", "held")
        bad = await session.call_tool("ledger", {"trace": trace})
        assert bad.is_error and "no device ledger" in bad.content[0].text

    bad = await session.call_tool("summary", {"trace": "no-such-trace"})
    assert bad.is_error
    bad = await session.call_tool("advise", {"trace": trace, "budget": "lots"})
    assert bad.is_error and "budget" in bad.content[0].text


def test_stdio_tools_answer_like_the_cli(tmp_path):
    outside = tmp_path / "outside.pickle"
    shutil.copy(SNAPSHOT, outside)

    async def main():
        params = mcp.StdioServerParameters(command=memory_tracer.collector_path(), args=["mcp", "--allow", DATA])
        async with stdio_client(params) as (read, write):
            async with mcp.ClientSession(read, write) as session:
                await session.initialize()
                await exercise(session, SNAPSHOT, OTHER)
                refused = await session.call_tool("summary", {"trace": str(outside)})
                assert refused.is_error and "outside the folders" in refused.content[0].text
                escape = await session.call_tool("summary", {"trace": os.path.join(DATA, "..", "..", "README.md")})
                assert escape.is_error

    asyncio.run(main())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_has_the_tools_behind_its_token(tmp_path):
    import httpx2

    token = "mcp-test-token"
    (tmp_path / "token").write_text(token)
    port = free_port()
    server = subprocess.Popen(
        [memory_tracer.collector_path(), "serve", "--port", str(port), "--data-dir", str(tmp_path / "data"), "--token-file", str(tmp_path / "token")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        auth = {"Authorization": f"Bearer {token}"}
        for _ in range(100):
            try:
                urllib.request.urlopen(urllib.request.Request(f"{base}/api/health", headers=auth), timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        ids = []
        for path in (SNAPSHOT, OTHER):
            with open(path, "rb") as f:
                req = urllib.request.Request(f"{base}/api/trace/upload?filename={os.path.basename(path)}", data=f.read(), headers=auth, method="POST")
            ids.append(json.load(urllib.request.urlopen(req))["trace_id"])

        async def main(headers):
            async with httpx2.AsyncClient(headers=headers, timeout=60) as client:
                async with streamable_http_client(f"{base}/mcp", http_client=client) as streams:
                    async with mcp.ClientSession(streams[0], streams[1]) as session:
                        await session.initialize()
                        await exercise(session, ids[0], ids[1])
                        refused = await session.call_tool("summary", {"trace": SNAPSHOT})
                        assert refused.is_error and "reads no paths" in refused.content[0].text

        asyncio.run(main(auth))
        without = urllib.request.Request(f"{base}/mcp", data=b"{}", headers={"Content-Type": "application/json"}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(without)
        assert e.value.code == 401
    finally:
        server.terminate()
        server.wait(timeout=30)
