"""Hostile clients, round two (issue 35): each attack over raw HTTP on loopback against the launched app.

Every client binds its own loopback address (127.0.0.x), so the app sees distinct peers. Each
defence has a named mutant in ``tools/mutant_security.py`` that these tests catch.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import logging
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from bench.probe import raw_http_predict
from pipeline.serving import owners
from tests.fakes import FakeModel
from tests.helpers import running_app
from tests.hostile import NoisyModel, fn_index, generate_data, join, peer, post_json

AUTH = ("--auth", "ann:s3cret", "--metrics-token", "scrape-me", "--trusted-proxies", "127.0.0.1")


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.fixture(scope="module")
def authed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    with running_app(tmp_path_factory.mktemp("authed"), *AUTH, load=FakeModel) as (url, demo, _adapter):
        yield url, demo


@pytest.fixture(scope="module")
def open_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, Any]]:
    args = ("--trusted-proxies", "127.0.0.1", "--rate-limit", "2")
    with running_app(tmp_path_factory.mktemp("open"), *args, load=FakeModel) as (url, demo, adapter):
        yield url, demo, adapter


def test_basic_bearer_and_form_guesses_are_metered_and_past_the_budget_nothing_is_compared(
    authed: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from pipeline.web.door.login import Login

    url, _demo = authed
    compared: list[str] = []
    user_of, opens_metrics = Login.user_of, Login.opens_metrics
    monkeypatch.setattr(Login, "user_of", lambda self, h: compared.append(h) or user_of(self, h))
    monkeypatch.setattr(Login, "opens_metrics", lambda self, h: compared.append(h) or opens_metrics(self, h))
    caplog.set_level(logging.WARNING, logger="pipeline.web.door.login")
    with peer("127.0.0.41") as guesser, peer("127.0.0.42") as other, peer("127.0.0.43") as scraper:
        # Basic on login_check (and on /config, /gradio_api/info): 10 wrong guesses are answered 401 ...
        for k in range(10):
            route = ("gradio_api/login_check", "config", "gradio_api/info")[k % 3]
            assert guesser.get(url + route, headers=basic("ann", f"guess{k}")).status_code == 401
        # ... then 429 with Retry-After, before any comparison: the right password waits too.
        before = len(compared)
        refused = guesser.get(url + "gradio_api/login_check", headers=basic("ann", "s3cret"))
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1, refused.text
        form = guesser.post(url + "login", data={"username": "ann", "password": "s3cret"})
        assert form.status_code == 429 and len(compared) == before
        # Another address is not slowed.
        assert other.get(url + "gradio_api/login_check", headers=basic("ann", "s3cret")).status_code == 200
        # Bearer tokens on /metrics take from the same kind of budget.
        for k in range(10):
            assert scraper.get(url + "metrics", headers={"Authorization": f"Bearer nope{k}"}).status_code == 401
        assert scraper.get(url + "metrics", headers={"Authorization": "Bearer scrape-me"}).status_code == 429
        time.sleep(int(refused.headers["retry-after"]))
        assert guesser.get(url + "gradio_api/login_check", headers=basic("ann", "s3cret")).status_code == 200
    lines = [r.getMessage() for r in caplog.records if "past the budget" in r.getMessage()]
    assert sorted(lines) == sorted(set(lines)) and len(lines) == 2, lines  # one line per identity
    assert any("addr:127.0.0.41" in line for line in lines) and any("addr:127.0.0.43" in line for line in lines)


def test_form_guesses_are_metered_by_the_answer(authed: Any) -> None:
    url, _demo = authed
    with peer("127.0.0.44") as guesser:
        codes = [
            guesser.post(url + "login", data={"username": "ann", "password": f"g{k}"}).status_code for k in range(11)
        ]
    assert codes == [400] * 10 + [429], codes


def test_under_auth_every_route_but_the_login_pages_needs_the_login_the_heartbeat_too(authed: Any) -> None:
    url, _demo = authed
    with peer("127.0.0.45") as anonymous, peer("127.0.0.46", headers=basic("ann", "s3cret")) as ann:
        with anonymous.stream("GET", url + "gradio_api/heartbeat/h1") as beat:  # a stream if let in: not read
            assert beat.status_code == 401
        with ann.stream("GET", url + "gradio_api/heartbeat/h1") as beat:
            assert beat.status_code == 200
        for path in ("gradio_api/info", "gradio_api/app_id", "gradio_api/queue/data?session_hash=s1"):
            assert anonymous.get(url + path).status_code == 401, path
        assert anonymous.post(url + "gradio_api/queue/join", json={"data": []}).status_code == 401
        assert anonymous.get(url).status_code == 200 and anonymous.get(url + "health").status_code == 200


def test_a_call_result_answers_only_the_identity_that_asked(open_app: Any) -> None:
    url, demo, _adapter = open_app
    with peer("127.0.0.47") as owner, peer("127.0.0.48") as thief:
        event = owner.post(url + "gradio_api/call/generate", json={"data": generate_data(prompt="mine")})
        assert event.status_code == 200, event.text
        event_id = event.json()["event_id"]
        assert thief.get(url + f"gradio_api/call/generate/{event_id}").status_code == 404
        cancel = {"session_hash": "thief1", "fn_index": fn_index(demo, "generate"), "event_id": event_id}
        assert thief.post(url + "gradio_api/cancel", json=cancel).status_code == 404
        with owner.stream("GET", url + f"gradio_api/call/generate/{event_id}") as stream:
            text = "".join(stream.iter_text())
        assert stream.status_code == 200 and "event: complete" in text and ".png" in text


def test_a_lone_surrogate_is_a_422_naming_the_field_on_every_event_and_health_stays_ok(open_app: Any) -> None:
    url, demo, adapter = open_app
    gen, apply, choose = (fn_index(demo, n) for n in ("generate", "apply", "choose"))
    with peer("127.0.0.49") as http:
        for _ in range(5):
            answer = join(http, url, gen, generate_data(prompt="a cat \ud800"))
            assert answer.status_code == 422 and "prompt must be valid Unicode text" in answer.text, answer.text
            time.sleep(0.5)  # within the rate: each is refused for its text, not its speed
        call = post_json(http, url + "gradio_api/call/generate", {"data": generate_data(negative_prompt="\udc00")})
        assert call.status_code == 422 and "negative_prompt must be valid Unicode text" in call.text
        bell = join(http, url, gen, generate_data(prompt="ring \x07"))
        assert bell.status_code == 422 and "must not contain control characters (U+0007" in bell.text
        paste = join(http, url, apply, ["Steps: 4\ud800"])
        assert paste.status_code == 422 and "valid Unicode text" in paste.text
        preset = join(http, url, choose, ["\udfff"])
        assert preset.status_code == 422 and "valid Unicode text" in preset.text
        health = http.get(url + "health").json()
    assert health["status"] == "ok" and health["consecutive_failures"] == 0, health
    assert adapter.consecutive_failures == 0


def test_deep_json_is_a_400_on_every_route_with_no_traceback_and_cancels_take_rate_tokens(
    open_app: Any, caplog: pytest.LogCaptureFixture
) -> None:
    url, _demo, _adapter = open_app
    caplog.set_level(logging.INFO)
    deep = b"[" * 200_000
    with peer("127.0.0.50") as http:
        for route in ("gradio_api/queue/join", "gradio_api/call/generate", "gradio_api/cancel", "gradio_api/reset"):
            answer = http.post(url + route, content=deep, headers={"content-type": "application/json"})
            assert answer.status_code == 400 and "deeper than 64" in answer.text, (route, answer.text)
        codes = [
            http.post(url + "gradio_api/cancel", content=deep, headers={"content-type": "application/json"}).status_code
            for _ in range(50)
        ]
    assert codes.count(429) >= 20 and set(codes) <= {400, 429}, codes  # 2 a second, 20 saved up
    stacks = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not stacks, [r.getMessage()[:200] for r in stacks]


def test_an_image_url_cannot_be_traced_to_an_address_and_the_key_is_never_served(open_app: Any) -> None:
    url, demo, adapter = open_app
    with peer("127.0.0.51") as http:
        done = raw_http_predict(url, fn_index(demo, "generate"), generate_data(), http=http)
        assert done["success"], done
        path = Path(done["output"]["data"][0][0]["image"]["path"])  # in the URL (here Gradio's copy of it)
        # The folder it was written to (and is served from where Gradio's cache is the output folder):
        folder = owners.owner_folder("addr:127.0.0.51", owners.key_of(adapter.output_dir))
        (written,) = adapter.output_dir.glob(f"*/{folder}/*.png")
        # The attack of issue 35: hash every address of a /16 the way the old names were made.
        names = f"{path} {' '.join(p.name for p in adapter.output_dir.glob('*/*'))}"
        traced = [
            ip
            for ip in ipaddress.ip_network("127.0.0.0/16")
            if hashlib.sha256(f"addr:{ip}".encode()).hexdigest()[:20] in names
            or hashlib.sha256(f"addr:{ip}".encode()).hexdigest()[:24] in names
        ]
        assert traced == []
        key = adapter.output_dir / owners.KEY_FILE
        assert key.exists()
        for route in (f"gradio_api/file={key}", f"gradio_api/file={written.parent}/../../{owners.KEY_FILE}"):
            assert http.get(url + route).status_code in (403, 404), route
        assert http.get(url + f"gradio_api/file={path}").status_code == 200


def test_a_many_identity_disk_attack_leaves_the_victim_every_image_within_its_lifetime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "outputs"))  # the default: images served as written
    args = ("--output-max-mb", "1", "--max-users-on-disk", "4", "--sweep-interval", "0.2")
    args += ("--trusted-proxies", "127.0.0.1", "--max-pixel-steps", str(256 * 256 * 4))
    with running_app(tmp_path, *args, load=lambda: NoisyModel()) as (url, demo, adapter):
        gen = fn_index(demo, "generate")
        victim: list[Path] = []
        with peer("127.0.0.60") as http:
            for k in range(2):  # about 50 KB each: within the floor of 256 KiB, over an even share of 1 MiB
                done = raw_http_predict(url, gen, generate_data(seed=k, width=128, height=128), http=http)
                victim.append(Path(done["output"]["data"][0][0]["image"]["path"]))
        time.sleep(0.3)
        for k in range(40):  # 40 identities, about 50 KB each (less than the victim holds): twice the budget
            with peer(f"127.0.1.{k + 1}") as http:
                data = generate_data(seed=100 + k, width=128, height=128)
                assert raw_http_predict(url, gen, data, http=http, session=uuid.uuid4().hex[:8])["success"]
            assert all(p.exists() for p in victim), f"the victim lost an image after attacker {k}"
        time.sleep(1.0)  # a few sweeps more
        assert all(p.exists() for p in victim)
        pngs = list(adapter.output_dir.rglob("*.png"))
        assert sum(p.stat().st_size for p in pngs) <= 1.3 * 2**20, len(pngs)  # the attackers' went first
