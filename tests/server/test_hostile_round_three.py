"""Hostile clients, round three (issue 46): each attack over raw HTTP against the launched app on the
embedded model, with ``/health`` probed every 50 ms from one address and another identity's txt2img
timed beside it from another.

What must hold under each attack: ``/health``'s worst answer under 0.5 s, the other identity's
request within twice its idle time, the attack refused by name; and after them all, the server's
memory within 200 MB of where it was. The same defences one by one, in process:
``tests/unit/test_hostile_round_three.py``; the named mutants: ``tools/mutant_security.py``.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Any, Callable, Iterator

import httpx
import psutil
import pytest

from bench.hostile import VICTIM, attack_threads, bystanders, idle_seconds
from bench.probe import raw_http_predict
from tests import malformed
from tests.helpers import api_fn_index, app_process
from tests.hostile import generate_data, peer, post_json

pytestmark = pytest.mark.timeout(600)

BODY_CAP = 2**20  # --max-body-kb 1024: the JSON routes' cap
HEALTH_WORST = 0.5


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, psutil.Process]]:
    """The app as a user starts it, in a process of its own: this test's clients (encoding megabytes,
    sending them) share no interpreter with it, and its CPU and memory are its own to measure."""
    with app_process(tmp_path_factory.mktemp("round-three"), "--mcp") as (url, proc, _log):
        yield url, psutil.Process(proc.pid)


@pytest.fixture(scope="module")
def idle(app: tuple[str, Any]) -> float:
    """The other identity's request alone (``bench.hostile.idle_seconds``); the server's memory then
    is what ``test_memory_after_every_attack_is_within_200_mb_of_before`` holds it to."""
    seconds = idle_seconds(app[0])
    BEFORE["rss"] = app[1].memory_info().rss
    return seconds


BEFORE: dict[str, int] = {}


def under_attack(url: str, idle: float, attacks: list[Callable[[], None]], tries: int = 3, bound: float = 2.0) -> None:
    """Run ``attacks`` at once (``bench.hostile.attack_threads``: each on its own thread, each
    asserting its own refusal) with the bystanders beside them (``bench.hostile.bystanders``: a
    process of their own), and hold both bounds. The machine is shared and two cores: a run that
    misses a bound is run again (up to ``tries`` in all), against the bystander's time alone measured
    again just before it (the module's first measure may have been taken while the other test worker
    idled), and the last must hold them (two full runs missed once each by 10-20 % with two tries) (the designs these tests guard against miss them by 3-10 times, every time:
    ``bench/results/bench-hostile-2026-12-05.json``). ``bound``: the bystander's time against idle."""
    for attempt in range(1, tries + 1):
        if attempt > 1:
            idle = max(idle, idle_seconds(url))
        with bystanders(url) as seen:
            failures = attack_threads(attacks)
        assert not failures, failures
        slowest = max(seen["times"])
        held = seen["errors"] == 0 and seen["worst"] < HEALTH_WORST and slowest <= bound * idle
        if held or attempt == tries:
            break
    assert seen["errors"] == 0 and seen["worst"] < HEALTH_WORST, f"/health worst {seen['worst']:.3f} s"
    assert slowest <= bound * idle, (
        f"the other identity's request took {slowest:.2f} s against {idle:.2f} s idle: {seen['times']}"
    )


def refused(answer: httpx.Response, status: int, *words: str) -> None:
    text = answer.text
    assert answer.status_code == status, (answer.status_code, text[:400])
    assert all(w in text for w in words), text[:400]


# -- the event loop: every check on client text linear ------------------------------------------------
def test_a_body_of_brackets_and_an_unclosed_string_at_the_cap_holds_nobody(app: Any, idle: float) -> None:
    url = app[0]
    body = b"[" * 65 + b'"' + b'\\"' * ((BODY_CAP - 200) // 2)
    routes = ["gradio_api/queue/join", "gradio_api/cancel", "sdapi/v1/txt2img", "v1/images/generations",
              "gradio_api/mcp/"]  # fmt: skip

    def attack(route: str, address: str) -> Callable[[], None]:
        def send() -> None:
            with peer(address) as http:
                answer = http.post(url + route, content=body, headers={"content-type": "application/json"})
                assert answer.status_code in (400, 422), (route, answer.status_code, answer.text[:200])

        return send

    under_attack(url, idle, [attack(r, f"127.0.1.{k}") for k, r in enumerate(routes, 1)])


def test_a_lora_tag_of_digits_at_the_body_cap_and_the_prompt_cap_is_refused_at_once(app: Any, idle: float) -> None:
    url = app[0]

    def long_tag() -> None:
        with peer("127.0.2.1") as http:
            answer = http.post(url + "sdapi/v1/txt2img", json={"prompt": "<lora:a:" + "0" * (BODY_CAP - 100)})
            refused(answer, 422, "prompt must be text of at most 2000 characters")

    def tag_at_the_cap() -> None:
        with peer("127.0.2.2") as http:
            answer = http.post(url + "sdapi/v1/txt2img", json={"prompt": "<lora:a:" + "0" * 1990 + ">"})
            refused(answer, 422, "LoRA", "is not loaded")

    under_attack(url, idle, [long_tag, tag_at_the_cap])


# -- the decoders: bounded by their work, in a pool of their own --------------------------------------
def every_image_input(url: str, data: bytes, address: str, word: str) -> list[Callable[[], None]]:
    """``data`` sent to every input that takes a picture, each attack from its own address: png-info,
    A1111's img2img (picture and mask), OpenAI's edits (picture and mask), and the page's upload then
    image-to-image. Each must be refused naming its field and ``word``. The bodies are built before
    the attack starts: what is timed is the server's work."""
    small = malformed.png_bytes(malformed.noisy(64, 64))
    base = address.rsplit(".", 1)[0]
    common = {"prompt": "a cat", "width": 64, "height": 64, "steps": 4}
    info_body = json.dumps({"image": b64(data)}).encode()
    img2img_bodies = {
        "init_images": json.dumps({**common, "init_images": [b64(data)]}).encode(),
        "mask": json.dumps({**common, "init_images": [b64(small)], "mask": b64(data)}).encode(),
    }
    as_json = {"content-type": "application/json"}

    def png_info() -> None:
        with peer(f"{base}.1") as http:
            refused(http.post(url + "sdapi/v1/png-info", content=info_body, headers=as_json), 422, "image:", word)

    def img2img(field: str) -> Callable[[], None]:
        def send() -> None:
            with peer(f"{base}.{2 if field == 'mask' else 3}") as http:
                refused(http.post(url + "sdapi/v1/img2img", content=img2img_bodies[field], headers=as_json), 422, word)

        return send

    def edit(field: str) -> Callable[[], None]:
        def send() -> None:
            files = {"image": ("i.png", small if field == "mask" else data)}
            files.update({"mask": ("m.png", data)} if field == "mask" else {})
            with peer(f"{base}.{4 if field == 'mask' else 5}") as http:
                answer = http.post(url + "v1/images/edits", data={"prompt": "a cat", "size": "64x64"}, files=files)
                refused(answer, 400, word)
                assert answer.json()["error"]["param"] == field

        return send

    def page() -> None:
        with peer(f"{base}.6", timeout=60) as http:
            stored = http.post(url + "gradio_api/upload", files={"files": ("a.png", data)})
            assert stored.status_code == 200, stored.text[:200]
            picture = {"path": stored.json()[0], "meta": {"_type": "gradio.FileData"}}
            data_list = generate_data(mode="image", image=picture, strength=0.5, width=64, height=64)
            message = raw_http_predict(url, api_fn_index(url), data_list, http=http)
            assert not message["success"] and word in str(message["output"]), message

    return [png_info, img2img("init_images"), img2img("mask"), edit("image"), edit("mask"), page]


def test_an_animated_png_of_100000_frames_to_every_image_input(app: Any, idle: float) -> None:
    url = app[0]
    apng = malformed.animated_png(frames=100_000, text="a cat")  # 6.6 MB: a frame is two chunks at least
    for attack in every_image_input(url, apng, "127.0.3.0", "chunks"):
        under_attack(url, idle, [attack])


def test_a_jpeg_of_100000_scans_to_every_image_input(app: Any, idle: float) -> None:
    url = app[0]
    jpeg = malformed.many_scan_jpeg(scans=100_000)
    for attack in every_image_input(url, jpeg, "127.0.4.0", "scans"):
        under_attack(url, idle, [attack])


def test_two_dozen_inpaints_from_one_identity_are_refused_before_decoding(app: Any, idle: float) -> None:
    url, server = app
    picture = malformed.png_bytes(malformed.noisy(256, 240))  # about 180 KB of noise
    black = malformed.png_bytes(malformed.noisy(256, 240, "L").point(lambda _v: 0))  # marks nothing: 422 once decoded
    big = malformed.smooth_jpeg(2048)  # 85 KB for 4 MP: past the cost budget, refused from its header
    common = {"prompt": "a cat", "width": 64, "height": 64, "steps": 4, "mask": b64(black)}
    bodies = [json.dumps({**common, "init_images": [b64(p)]}).encode() for p in (picture, big)]
    answers: list[int] = []

    def inpaint(body: bytes) -> Callable[[], None]:
        def send() -> None:
            with peer("127.0.5.1") as http:
                answer = http.post(url + "sdapi/v1/img2img", content=body, headers={"content-type": "application/json"})
                answers.append(answer.status_code)

        return send

    cpu = server.cpu_times()
    under_attack(url, idle, [inpaint(bodies[k % 2]) for k in range(24)])
    spent = sum(server.cpu_times()[:2]) - sum(cpu[:2])  # the web side's: the model has a process of its own
    # each refused: by the waiting cap before any decode (429), or once decoded, one at a time (422)
    assert sorted(set(answers)) == [422, 429], answers
    assert spent < 3.0, f"{spent:.1f} s of the server's CPU"  # was 33-38 s, every picture decoded first


def test_six_bodies_of_51_mib_are_read_off_the_loop_and_memory_comes_back(app: Any, idle: float) -> None:
    url, server = app
    before = server.memory_info().rss
    fake = b64(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * (19 * 2**20 // 256))  # 25.3 MiB of base64 each
    body = json.dumps({"prompt": "a cat", "width": 64, "height": 64, "steps": 4, "init_images": [fake], "mask": fake})
    data = body.encode()

    def big(k: int) -> Callable[[], None]:
        def send() -> None:
            with peer(f"127.0.6.{k}", timeout=120) as http:
                answer = http.post(url + "sdapi/v1/img2img", content=data, headers={"content-type": "application/json"})
                assert answer.status_code in (422, 429), (answer.status_code, answer.text[:200])

        return send

    # Reading six bodies of 51 MiB takes the two cores' CPU whoever reads them: the bystander slows by that
    # (4.3x once, beside the other test worker); a body read on the loop would block /health, whose
    # bound (HEALTH_WORST) is the loop's. So the bystander's bound here is 5x.
    under_attack(url, idle, [big(k) for k in range(1, 7)], bound=5.0)
    time.sleep(1.0)  # the last answers' buffers released
    grown = server.memory_info().rss - before
    assert grown < 200 * 2**20, f"{grown / 2**20:.0f} MB more than before the attack"


def test_memory_after_every_attack_is_within_200_mb_of_before(app: Any, idle: float) -> None:
    """After every attack above (this module's order), the server holds what it held before them."""
    time.sleep(1.0)
    grown = app[1].memory_info().rss - BEFORE["rss"]
    assert grown < 200 * 2**20, f"{grown / 2**20:.0f} MB more than before the attacks"


# -- the quota: a quota of work, the login's wherever it is -----------------------------------------
def test_an_interrupt_at_the_last_step_and_a_dropped_stream_both_spend_the_quota(launch: Any) -> None:
    url, _demo, _adapter = launch("--quota-images-per-hour", "2", "--rate-limit", "50", name="work-quota")
    long_job = {**VICTIM, "steps": 60, "width": 64, "height": 64}
    answers: list[httpx.Response] = []
    with peer("127.0.7.1", timeout=120) as http:
        job = threading.Thread(target=lambda: answers.append(http.post(url + "sdapi/v1/txt2img", json=long_job)))
        job.start()
        with peer("127.0.7.1") as poll:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                state = poll.get(url + "sdapi/v1/progress").json()["state"]
                # late in the job, with room for the interrupt's own round trip on a loaded machine (at 3
                # steps before the end the 64 px job once finished first, beside the other test worker)
                if state["sampling_steps"] and state["sampling_step"] >= state["sampling_steps"] - 12:
                    break
                time.sleep(0.01)
            assert poll.post(url + "sdapi/v1/interrupt").json()["interrupted"] == 1
        job.join(60)
        assert answers[0].status_code == 200 and answers[0].json()["images"] == []  # interrupted: no picture
        # a stream dropped after its first preview
        stream = {"prompt": "a cat", "size": "64x64", "stream": True, "partial_images": 2, "num_inference_steps": 60}
        with http.stream("POST", url + "v1/images/generations", json=stream) as events:
            for line in events.iter_lines():
                if "partial_image" in line:
                    break
        over = http.post(url + "sdapi/v1/txt2img", json={**VICTIM, "steps": 2, "width": 64, "height": 64})
        refused(over, 429, "Quota")


def test_one_login_from_six_addresses_gets_its_quota_once(launch: Any) -> None:
    url, _demo, _adapter = launch("--auth", "ann:s3cret", "--quota-images-per-hour", "2", "--rate-limit", "50",
                                  name="login-quota")  # fmt: skip
    auth = {"authorization": "Basic " + b64(b"ann:s3cret")}
    small = {**VICTIM, "steps": 2, "width": 64, "height": 64}
    statuses = []
    for k in range(2, 8):
        with peer(f"127.0.8.{k}", timeout=60) as http:
            statuses.append(http.post(url + "sdapi/v1/txt2img", json=small, headers=auth).status_code)
    assert statuses == [200, 200, 429, 429, 429, 429], statuses


def test_an_api_success_is_counted_completed(app: Any) -> None:
    url = app[0]

    def completed(http: httpx.Client) -> float:
        lines = http.get(url + "metrics").text.splitlines()
        return sum(float(line.split()[-1]) for line in lines if line.startswith('jobs_total{outcome="completed"}'))

    with peer("127.0.9.1", timeout=60) as http:
        before = completed(http)
        assert http.post(url + "sdapi/v1/txt2img", json={**VICTIM, "steps": 2}).status_code == 200
        assert post_json(http, url + "v1/images/generations", {"prompt": "a", "size": "64x64"}).status_code == 200
        assert completed(http) == before + 2
        assert http.get(url + "health").json()["consecutive_failures"] == 0
