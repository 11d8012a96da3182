"""The HTTP APIs in the same line as the page (issue 39): the login and its metering on every route,
one quota across the page's protocol, MCP, ``/sdapi/v1`` and ``/v1/images``, and fairness across them: a
flood through ``/sdapi/v1`` keeps its waiting cap, and a page user waits behind one job at most."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from typing import Any

import httpx
import pytest

from tests.helpers import MCP_TOOL_ARGS, gate_held, mcp_session, raw_request, wait_for
from tests.hostile import peer

pytestmark = pytest.mark.timeout(600)

SMALL = {"prompt": "a red circle", "seed": 1, "steps": 3, "width": 64, "height": 64, "cfg_scale": 5}
LOGIN = ("alice", "wonderland")
# Jobs long enough (about a second each here) that the order they end in is the order they ran in,
# whatever each client's own overhead.
LONGER = {**SMALL, "steps": 20, "width": 128, "height": 128}


def basic(user: str, password: str) -> dict[str, str]:
    return {"authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_under_auth_every_api_route_takes_the_login_and_meters_wrong_guesses(launch: Any) -> None:
    import openai
    import webuiapi

    url, _demo, _adapter = launch("--auth", ":".join(LOGIN), "--rate-limit", "50", name="authed")
    routes = [("GET", "sdapi/v1/progress"), ("GET", "sdapi/v1/sd-models"), ("POST", "sdapi/v1/txt2img"),
              ("POST", "sdapi/v1/interrupt"), ("POST", "v1/images/generations"), ("POST", "v1/images/edits")]  # fmt: skip
    with peer("127.0.0.3") as anyone:
        for method, path in routes:
            missing = anyone.request(method, url + path, json=SMALL)
            assert missing.status_code == 401, (path, missing.text)
            if path.startswith("v1/"):  # OpenAI's clients read OpenAI's error shape, the door's refusals too
                assert missing.json()["error"]["message"] == "Login required."
    with peer("127.0.0.4") as guesser:
        for k in range(10):  # the failed-login budget, spent on the API routes and both headers
            method, path = routes[k % len(routes)]
            headers = basic("alice", f"guess{k}") if k % 2 else {"authorization": f"Bearer alice:guess{k}"}
            assert guesser.request(method, url + path, json=SMALL, headers=headers).status_code == 401
        metered = guesser.post(url + "v1/images/generations", json=SMALL, headers=basic(*LOGIN))
        assert metered.status_code == 429 and int(metered.headers["retry-after"]) >= 1  # not even the right one
        assert metered.json()["error"]["type"] == "rate_limit_exceeded"
    # The right login, as each real client sends it: OpenAI's API key as "user:password" (Bearer), Basic for webuiapi.
    api = openai.OpenAI(base_url=url + "v1", api_key=":".join(LOGIN))
    assert api.images.generate(prompt="a red circle", size="64x64", extra_body={"num_inference_steps": 2}).data
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "v1", api_key="alice:nope").images.generate(prompt="a red circle")
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    sd = webuiapi.WebUIApi(host="127.0.0.1", port=port, username=LOGIN[0], password=LOGIN[1])
    assert sd.txt2img(**SMALL).image.size == (64, 64)


def mcp_generate(url: str) -> Any:
    """One ``generate`` tool call through the app's MCP server (the ``mcp`` client), its result."""
    return asyncio.run(mcp_session(url, lambda session: session.call_tool("generate", MCP_TOOL_ARGS)))


def test_the_quota_counts_every_protocol_together(launch: Any, tmp_path: Any) -> None:
    import openai
    from gradio_client import Client

    url, _demo, _adapter = launch("--quota-images-per-hour", "4", "--rate-limit", "50", "--mcp", name="quota")
    client = Client(url, verbose=False, download_files=str(tmp_path))
    client.predict(**raw_request(num_inference_steps=2), api_name="/generate")  # the page's protocol: 1
    assert not mcp_generate(url).isError  # MCP: 2
    with httpx.Client(timeout=60) as http:
        assert http.post(url + "sdapi/v1/txt2img", json=SMALL).status_code == 200  # 3
        api = openai.OpenAI(base_url=url + "v1", api_key="unused")
        assert api.images.generate(prompt="a red circle", extra_body={"num_inference_steps": 2}).data  # 4
        over = http.post(url + "sdapi/v1/txt2img", json=SMALL)
        assert over.status_code == 429 and 3000 <= int(over.headers["retry-after"]) <= 3601, over.text
        assert "4 of your 4 images in the last hour" in over.json()["detail"] and "UTC" in over.json()["detail"]
    with pytest.raises(openai.RateLimitError) as refused:
        api.images.generate(prompt="a red circle")
    assert refused.value.body["type"] == "rate_limit_exceeded" and "Quota" in refused.value.body["message"]
    with pytest.raises(Exception, match="Quota"):
        client.predict(**raw_request(num_inference_steps=2), api_name="/generate")
    refused_call = mcp_generate(url)
    assert refused_call.isError and "Quota" in str(refused_call.content)
    with peer("127.0.0.2") as other:  # another identity has its own hour
        assert other.post(url + "sdapi/v1/txt2img", json=SMALL).status_code == 200


def test_a_flood_through_sdapi_keeps_its_cap_and_a_page_user_waits_behind_one_job(launch: Any, tmp_path: Any) -> None:
    from gradio_client import Client

    url, _demo, adapter = launch("--max-waiting-per-user", "3", "--max-batch-size", "1", "--rate-limit", "50",
                                 "--max-pixel-steps", str(10**9), name="fair")  # fmt: skip
    with peer("127.0.0.3") as warm:
        assert warm.post(url + "sdapi/v1/txt2img", json=SMALL).status_code == 200  # the adapter knows its loop
    client = Client(url, verbose=False, download_files=str(tmp_path))
    done: dict[str, float] = {}

    def flood(k: int) -> None:
        with peer("127.0.0.2") as flooder:
            answer = flooder.post(url + "sdapi/v1/txt2img", json={**LONGER, "seed": k}, timeout=120)
            assert answer.status_code == 200, answer.text
            done[f"flood{k}"] = time.monotonic()

    with gate_held(adapter):
        threads = []
        for k in range(3):
            threads.append(threading.Thread(target=flood, args=(k,)))
            threads[-1].start()
            wait_for(lambda k=k: adapter.gpu_queue_depth == k + 1, f"flood request {k} waits at the gate")
        with peer("127.0.0.2") as flooder:
            capped = flooder.post(url + "sdapi/v1/txt2img", json=SMALL)
        assert capped.status_code == 429 and "already have 3 requests waiting" in capped.json()["detail"]
        page = raw_request(num_inference_steps=LONGER["steps"], width=128, height=128)
        job = client.submit(**page, api_name="/generate")  # the page's protocol
        wait_for(lambda: adapter.gpu_queue_depth == 4, "the page user's request waits at the gate")
    job.result(timeout=120)
    done["page"] = time.monotonic()
    for thread in threads:
        thread.join(120)
    order = sorted(done, key=done.__getitem__)
    assert order.index("page") <= 1, order  # behind at most one of the flood's jobs
