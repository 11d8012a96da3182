"""Hostile clients over raw HTTP on loopback: each attack of issue 26 against the launched app.

Every client here binds its own loopback address (127.0.0.x), so the app sees distinct peers, as
it would see distinct hosts on the internet; the app trusts only 127.0.0.1 as a proxy. Nothing
leaves the machine: Gradio's downloader and URL streamer are replaced by recorders, which must
stay empty. Each defence has a named mutant in ``tools/mutant_patches.py`` that these tests catch.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from PIL import Image

from bench.probe import raw_http_predict
from pipeline.web.apis.a1111 import parse_parameters
from pipeline.web.gradio_internals import temp_file_count
from tests.fakes import FakeModel
from tests.helpers import running_app, wait_for
from tests.hostile import NoisyModel, fn_index, generate_data, join, peer

LIMITS = (
    "--trusted-proxies",
    "127.0.0.1",
    "--max-sessions-per-user",
    "4",
    "--rate-limit",
    "2",
    "--max-connections-per-address",
    "8",
    "--request-timeout",
    "1",
    "--max-pixel-steps",
    "1000000",
)


class Recorder:
    """Stands in for Gradio's URL downloader and streamer: records what would have been fetched."""

    def __init__(self) -> None:
        self.fetched: list[str] = []

    async def download(self, url: str, cache_dir: str) -> str:
        self.fetched.append(url)
        raise RuntimeError("the recording downloader fetches nothing")

    async def stream(self, url: str, request: Any) -> Any:
        self.fetched.append(url)
        raise RuntimeError("the recording streamer fetches nothing")


@pytest.fixture(scope="module")
def recorder() -> Iterator[Recorder]:
    import gradio.processing_utils
    import gradio.routes

    rec = Recorder()
    saved = gradio.processing_utils.async_ssrf_protected_download, gradio.routes.secure_url_stream_response
    gradio.processing_utils.async_ssrf_protected_download = rec.download
    gradio.routes.secure_url_stream_response = rec.stream
    yield rec
    gradio.processing_utils.async_ssrf_protected_download, gradio.routes.secure_url_stream_response = saved


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, recorder: Recorder) -> Iterator[tuple[str, Any, Any, FakeModel]]:
    model = FakeModel()
    with running_app(tmp_path_factory.mktemp("hostile"), *LIMITS, load=lambda: model) as (url, demo, adapter):
        yield url, demo, adapter, model


def test_a_megabyte_paste_is_refused_at_once_and_health_keeps_answering(app: Any) -> None:
    url, demo, _adapter, _model = app
    apply = fn_index(demo, "apply")
    latencies: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                start = time.monotonic()
                assert http.get(url + "health").status_code == 200
                latencies.append(time.monotonic() - start)
                time.sleep(0.02)

    prober = threading.Thread(target=probe)
    prober.start()
    paste = "x" * 1_000_000  # one line, no colon: the backtracking regular expression's worst case
    answers: list[tuple[int, float, str]] = []

    def send() -> None:
        with peer("127.0.0.2") as http:
            start = time.monotonic()
            answer = join(http, url, apply, [paste])
            answers.append((answer.status_code, time.monotonic() - start, answer.text))

    pasters = [threading.Thread(target=send) for _ in range(5)]
    try:
        for t in pasters:
            t.start()
        for t in pasters:
            t.join(30)
        time.sleep(0.5)
    finally:
        stop.set()
        prober.join(30)
    assert len(answers) == 5
    for status, took, text in answers:
        assert status == 422 and took < 1.0, (status, took, text[:300])
        assert '"message":"Parameters text (AUTOMATIC1111 format' in text and '"parameter_name":"pasted"' in text
        assert "must be text of at most 8000 characters; got 1000000 characters" in text
    latencies.sort()
    assert latencies and latencies[int(0.99 * (len(latencies) - 1))] < 1.0, latencies[-5:]
    # The page's small events run on a few worker threads, not on every thread there is.
    assert {demo.fns[i].concurrency_limit for i in (apply, fn_index(demo, "zipped"))} <= {2, 4}


def test_history_and_zip_come_only_from_what_the_server_wrote_for_that_session(app: Any) -> None:
    url, demo, _adapter, _model = app
    gen, remember, zipped = (fn_index(demo, n) for n in ("generate_ui", "remember", "zipped"))
    with peer("127.0.0.3") as owner, peer("127.0.0.4") as thief:
        done = raw_http_predict(url, gen, generate_data(), http=owner, session="owner1")
        assert done["success"], done
        assert raw_http_predict(url, remember, [], http=owner, session="owner1")["success"]
        archive = raw_http_predict(url, zipped, [], http=owner, session="owner1")
        zip_path = archive["output"]["data"][0]["value"]["path"]
        assert zip_path.endswith(".zip")
        # The old attack: remember a gallery of the zip itself, then zip again. remember takes nothing now.
        forged = [{"image": {"path": zip_path, "meta": {"_type": "gradio.FileData"}}}] * 24
        refused = join(thief, url, remember, [forged, {"status": "done", "seeds": [1] * 24}], session="thief1")
        assert refused.status_code == 400, refused.text
        # Another user's session hash is not theirs to read or zip.
        stolen = join(thief, url, zipped, [], session="owner1")
        assert stolen.status_code == 403 and "belongs to someone else" in stolen.text
        assert thief.get(url + "gradio_api/queue/data", params={"session_hash": "owner1"}).status_code == 403
        # Their own session has no history: no zip, nothing of anyone else's.
        empty = raw_http_predict(url, zipped, [], http=thief, session="thief2")
        assert empty["success"] and not empty["output"]["data"][0].get("value")


@pytest.mark.parametrize("where", ["generate", "apply", "select"])
def test_file_shaped_payloads_are_refused_before_gradio_fetches_anything(
    app: Any, recorder: Recorder, where: str
) -> None:
    url, demo, _adapter, model = app
    calls = len(model.calls)
    file_data = {
        "path": "https://example.com/big.bin",
        "url": "https://example.com/big.bin",
        "meta": {"_type": "gradio.FileData"},
    }
    with peer("127.0.0.5") as http:
        if where == "generate":
            data = generate_data()
            data[0] = file_data
            answer = join(http, url, fn_index(demo, "generate"), data)
        elif where == "apply":
            answer = join(http, url, fn_index(demo, "apply"), [file_data])
        else:  # a select event's data: cut down to its index, the file in it never reaches Gradio
            answer = join(
                http, url, fn_index(demo, "restore_selected"), [], event_data={"index": 0, "value": file_data}
            )
            assert answer.status_code == 200
            time.sleep(0.5)
    if where != "select":
        assert answer.status_code == 422 and "must not be a file" in answer.text, answer.text
    assert recorder.fetched == [] and len(model.calls) == calls


def test_urls_and_closed_routes_fetch_nothing(app: Any, recorder: Recorder) -> None:
    url, _demo, _adapter, _model = app
    with peer("127.0.0.6") as http:
        for path in (
            "gradio_api/file=https://example.com/x.png",
            "gradio_api/file=http%3A//example.com/x",
            "gradio_api/file=//example.com/x",
            "gradio_api/proxy=https://x.hf.space/file=a",
            "monitoring",
            "monitoring/summary",
            "gradio_api/vibe-code",
        ):
            assert http.get(url + path).status_code in (403, 404), path
        for path in (
            "gradio_api/process_recording",
            "gradio_api/run/generate",
            "gradio_api/api/generate",
            "gradio_api/component_server",
            "gradio_api/stream/x",
            "gradio_api/vibe-edit",
        ):
            assert http.post(url + path, json={"data": []}).status_code == 404, path
        assert http.get(url + "health").status_code == 200 and http.get(url).status_code == 200
    assert recorder.fetched == []


def test_a_flood_of_fresh_sessions_is_refused_and_a_waiting_users_job_and_history_stay(tmp_path: Path) -> None:
    model = FakeModel(hold=True)
    with running_app(tmp_path, *LIMITS, load=lambda: model) as (url, demo, adapter):
        gen, remember = fn_index(demo, "generate_ui"), fn_index(demo, "remember")
        results: list[dict[str, Any]] = []
        with peer("127.0.0.7") as user, peer("127.0.0.8") as flood:
            waiting = threading.Thread(
                target=lambda: results.append(raw_http_predict(url, gen, generate_data(), http=user, session="u1"))
            )
            waiting.start()
            wait_for(lambda: model.active == 1, "the user's job runs")
            codes = [
                join(flood, url, gen, generate_data(), session=uuid.uuid4().hex[:11]).status_code for _ in range(200)
            ]
            assert codes.count(429) >= 190, codes  # four sessions (the cap), then nothing more
            # One session flooding a cheap event: the identity's bucket (2 a second, 20 saved up) runs dry.
            with peer("127.0.0.17") as same:
                shown = fn_index(demo, "shown")
                answers = [join(same, url, shown, [64, 64], session="one") for _ in range(100)]
            limited = [a for a in answers if a.status_code == 429]
            assert len(limited) >= 70 and all(int(a.headers["retry-after"]) >= 1 for a in limited), len(limited)
            assert adapter.gpu_queue_depth + model.active <= 5
            for _ in range(len(model.calls) + 8):
                model.release.release()
            waiting.join(30)
            assert results and results[0]["success"], results
            assert raw_http_predict(url, remember, [], http=user, session="u1")["success"]
        from pipeline.web.page.site import site_of

        assert len(site_of(demo).results.history("u1")) == 1  # the user's history is intact


def test_two_people_on_one_login_from_two_addresses_both_get_in(tmp_path: Path) -> None:
    model = FakeModel(hold=True)
    args = (*LIMITS, "--auth", "u:p", "--max-waiting-per-user", "3", "--concurrency", "8", "--max-batch-size", "1")
    basic = {"Authorization": "Basic " + base64.b64encode(b"u:p").decode()}
    with running_app(tmp_path, *args, load=lambda: model) as (url, demo, adapter):
        gen = fn_index(demo, "generate")
        with peer("127.0.0.9", headers=basic) as a, peer("127.0.0.10", headers=basic) as b:
            assert a.get(url + "config").status_code == 200  # Basic logs a program in
            assert httpx.get(url + "config").status_code == 401
            for k in range(5):
                answer = join(a, url, gen, generate_data(num_inference_steps=k + 1, width=64 + 8 * k), session="a1")
                assert answer.status_code == 200, answer.text
            wait_for(lambda: model.active == 1 and adapter.gpu_queue_depth == 3, "A's first runs, three wait")
            out = raw_http_predict_background(url, gen, generate_data(prompt="B's"), b)
            wait_for(lambda: adapter.gpu_queue_depth == 4, "B waits too: another user")
            for _ in range(8):
                model.release.release()
            out.join(30)
        assert "B's" in [job.prompts[0] for job in model.calls]


def raw_http_predict_background(url: str, fn: int, data: list[Any], http: httpx.Client) -> threading.Thread:
    thread = threading.Thread(target=lambda: raw_http_predict(url, fn, data, http=http))
    thread.start()
    return thread


def test_forged_and_repeated_forwarded_for_headers_name_nobody_else(tmp_path: Path) -> None:
    model = FakeModel(hold=True)
    args = (*LIMITS, "--max-waiting-per-user", "1", "--concurrency", "6", "--max-batch-size", "1")
    with running_app(tmp_path, *args, load=lambda: model) as (url, demo, adapter):
        gen = fn_index(demo, "generate")
        with peer("127.0.0.11") as direct, peer("127.0.0.1") as proxy:
            first = raw_http_predict_background(url, gen, generate_data(prompt="d1"), direct)
            wait_for(lambda: model.active == 1, "the direct client's first runs")
            ok = join(direct, url, gen, generate_data())
            assert ok.status_code == 200
            wait_for(lambda: adapter.gpu_queue_depth == 1, "its second waits")
            # A direct client writing X-Forwarded-For is still itself: its cap refuses it.
            for forged in ("203.0.113.1", "203.0.113.2, 203.0.113.3"):
                body = {"data": generate_data(), "fn_index": gen, "session_hash": uuid.uuid4().hex[:11]}
                refused = raw_json(direct, url, body, {"X-Forwarded-For": forged})
                assert "You already have 1 request waiting" in refused, refused
            # Behind the trusted proxy, what a client wrote stays left of what the proxy appended, on any line.
            hops = [("X-Forwarded-For", "127.0.0.11"), ("X-Forwarded-For", "198.51.100.7")]
            body = {"data": generate_data(prompt="p"), "fn_index": gen, "session_hash": uuid.uuid4().hex[:11]}
            assert proxy.post(url + "gradio_api/queue/join", json=body, headers=hops).status_code == 200
            wait_for(lambda: adapter.gpu_queue_depth == 2, "the proxied client is another user")
            for _ in range(6):
                model.release.release()
            first.join(30)


def raw_json(http: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]) -> str:
    """Join, then read the event's completion (its error message) from the session's stream."""
    joined = http.post(url + "gradio_api/queue/join", json=body, headers=headers)
    if joined.status_code != 200:
        return joined.text
    with http.stream(
        "GET", url + "gradio_api/queue/data", params={"session_hash": body["session_hash"]}, headers=headers
    ) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:") and json.loads(line[5:]).get("msg") == "process_completed":
                return line
    return ""


def test_an_over_budget_request_is_refused_before_the_queue(app: Any) -> None:
    url, demo, adapter, model = app
    calls = len(model.calls)
    with peer("127.0.0.12") as http:
        answer = join(
            http,
            url,
            fn_index(demo, "generate"),
            generate_data(width=512, height=512, num_inference_steps=50, num_images=4),
        )
    assert answer.status_code == 422, answer.text
    assert "pixel-steps (the cost budget, --max-pixel-steps)" in answer.text and "512×512×50×4" in answer.text
    assert len(model.calls) == calls and adapter.gpu_queue_depth == 0


def _connect(url: str, source: str) -> socket.socket:
    port = httpx.URL(url).port
    s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    return s


def _answer(s: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(OSError):
        while chunk := s.recv(65536):
            data += chunk
    return data


def test_slow_headers_a_huge_body_and_too_many_connections_are_cut_off(app: Any) -> None:
    url, _demo, _adapter, _model = app
    slow = _connect(url, "127.0.0.13")
    slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and nothing more
    start = time.monotonic()
    assert _answer(slow).startswith(b"HTTP/1.1 408"), "slow headers were waited for"
    assert time.monotonic() - start < 5  # --request-timeout 1
    big = _connect(url, "127.0.0.13")
    big.sendall(b"POST /gradio_api/queue/join HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n")
    assert _answer(big).startswith(b"HTTP/1.1 413")
    chunked = _connect(url, "127.0.0.13")
    chunked.sendall(b"POST /gradio_api/queue/join HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    sent = 0
    with contextlib.suppress(OSError):
        while sent < 100 * 2**20:
            chunked.sendall(b"10000\r\n" + b"x" * 0x10000 + b"\r\n")
            sent += 0x10000
    assert sent <= 8 * 2**20, f"{sent} bytes of a chunked body were read"
    held = [_connect(url, "127.0.0.14") for _ in range(8)]
    extra = _connect(url, "127.0.0.14")
    assert _answer(extra).startswith(b"HTTP/1.1 429")
    with peer("127.0.0.15") as other:
        assert other.get(url + "health").status_code == 200  # another address is untouched
    for s in [slow, big, chunked, extra, *held]:
        s.close()


def test_a_prompts_newlines_plant_no_metadata_and_the_paste_reads_it_back(app: Any) -> None:
    url, demo, _adapter, _model = app
    prompt = "a red circle\nNegative prompt: planted\nSteps: 99, Sampler: Heun, CFG scale: 1, Seed: 5, Size: 64x64"
    with peer("127.0.0.16") as http:
        done = raw_http_predict(
            url,
            fn_index(demo, "generate"),
            generate_data(prompt=prompt, negative_prompt="dark, blurry: no\nmore"),
            http=http,
        )
        assert done["success"], done
        path = done["output"]["data"][0][0]["image"]["path"]
        text = Image.open(path).text["parameters"]
        assert len(text.splitlines()) == 3, text
        pasted = parse_parameters(text)
        assert pasted.settings["Steps"] == "4" and pasted.settings["Seed"] == "1"
        assert pasted.negative_prompt == "dark, blurry: no more"
        applied = raw_http_predict(url, fn_index(demo, "apply"), [text], http=http)
        assert applied["success"], applied
        values = applied["output"]["data"]
        assert values[0] == " ".join(prompt.splitlines()) and values[1] == "dark, blurry: no more"
        assert "<strong>Filled:</strong>" in values[-1]


def test_gradio_temp_file_sets_stay_bounded_under_a_soak(tmp_path: Path) -> None:
    args = (
        "--output-max-mb",
        "1",
        "--sweep-interval",
        "0.1",
        "--rate-limit",
        "1000",
        "--max-sessions-per-user",
        "1000",
        "--max-pixel-steps",
        str(256 * 256 * 4),
    )
    with running_app(tmp_path, *args, load=lambda: NoisyModel()) as (url, demo, _adapter):
        gen = fn_index(demo, "generate")
        counts = []
        with httpx.Client(timeout=30) as http:
            for k in range(240):
                assert raw_http_predict(url, gen, generate_data(seed=k, width=256, height=256), http=http)["success"]
                if k % 40 == 39:
                    time.sleep(0.5)  # a sweep or more
                    counts.append(temp_file_count(demo))
        assert counts[-1] <= counts[1] * 1.5 + 10, counts  # bounded: it does not keep growing with requests


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs for the app's outputs (and Gradio's cache in it); skipped where mounting is not allowed."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_says_retry_later_leaves_no_partial_file_and_the_app_serves_on(
    small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(small_disk))
    args = ("--output-dir", str(small_disk), "--sweep-interval", "3600", "--max-pixel-steps", str(256 * 256 * 4))
    with running_app(small_disk.parent, *args, load=lambda: NoisyModel()) as (url, demo, _adapter):
        gen = fn_index(demo, "generate")
        with peer("127.0.0.18") as http:
            outcomes = [
                raw_http_predict(url, gen, generate_data(seed=k, width=256, height=256), http=http) for k in range(8)
            ]  # about 200 KB each: the disk fills within five
        errors = [o["output"].get("error") for o in outcomes if not o["success"]]
        assert errors and all(e == "The server's storage is full; please retry later." for e in errors), errors
        assert not list(small_disk.rglob("*.tmp")), "a partial file was left"
        for png in small_disk.rglob("*.png"):
            png.unlink()  # room again: the next request is served
        with peer("127.0.0.18") as http:
            assert raw_http_predict(url, gen, generate_data(seed=99), http=http)["success"]
