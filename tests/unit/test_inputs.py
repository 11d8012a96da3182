"""The front door's input policy: every event's inputs bounded, nothing file-shaped, event data cut down."""

from __future__ import annotations

from typing import Any

import gradio as gr
import pytest

from pipeline.web.door.inputs import SMALL_TEXT, InputPolicy, Refused, file_shaped, select_data


@pytest.fixture(scope="module")
def policy() -> tuple[InputPolicy, dict[str, int]]:
    with gr.Blocks() as demo:
        text = gr.Textbox(label="Parameters text", max_length=100)
        number = gr.Number(label="Seed")
        out = gr.Textbox()
        button = gr.Button()
        button.click(fn=lambda pasted, seed: pasted, inputs=[text, number], outputs=[out])
        button.click(fn=None, js="() => 1", outputs=[out])  # js only: nothing to run on the server
    index = {("py" if fn.fn is not None else "js"): i for i, fn in demo.fns.items()}
    return InputPolicy(demo), index


def join(fn_index: int, data: list[Any], **extra: Any) -> dict[str, Any]:
    return {"data": data, "fn_index": fn_index, "session_hash": "abc123", "trigger_id": 1, **extra}


def refusal(policy: InputPolicy, body: Any) -> Refused:
    with pytest.raises(Refused) as caught:
        policy.check_join(body)
    return caught.value


def test_a_well_formed_join_passes_with_its_event_data_cut_to_the_index(policy: Any) -> None:
    rules, index = policy
    event, cleaned = rules.check_join(join(index["py"], ["a paste", 3], event_data={"index": 2, "value": "x" * 999}))
    assert event.fn_index == index["py"] and cleaned["data"] == ["a paste", 3]
    assert cleaned["event_data"] == {"index": 2, "value": None, "selected": True}


def test_over_long_text_is_refused_naming_the_field_and_the_cap(policy: Any) -> None:
    rules, index = policy
    refused = refusal(rules, join(index["py"], ["x" * 1_000_000, 3]))
    assert refused.status == 422
    bad = [d for d in refused.detail if not d["is_valid"]]
    assert bad == [
        {
            "__type__": "validate",
            "is_valid": False,
            "parameter_name": "pasted",
            "message": "Parameters text must be text of at most 100 characters; got 1000000 characters",
        }
    ]
    assert len(refused.detail) == 2  # one entry per input, as Gradio's validator answers


@pytest.mark.parametrize(
    "value",
    [
        {"path": "https://example.com/x.png", "meta": {"_type": "gradio.FileData"}},
        {"path": "/etc/passwd"},
        [1, {"url": "https://example.com/a"}],
        {"meta": {"_type": "gradio.FileData"}},
    ],
)
def test_a_file_shaped_value_anywhere_is_refused(policy: Any, value: Any) -> None:
    rules, index = policy
    refused = refusal(rules, join(index["py"], ["a", value]))
    assert refused.status == 422 and "Seed must not be a file" in str(refused.detail)


def test_a_large_non_text_value_is_refused(policy: Any) -> None:
    rules, index = policy
    assert refusal(rules, join(index["py"], ["a", list(range(1000))])).status == 422
    assert refusal(rules, join(index["py"], ["a", "x" * (SMALL_TEXT + 1)])).status == 422
    rules.check_join(join(index["py"], ["a", [1, 2, 3]]))  # small: types are the validators' business


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ("not an object", 400),
        ({"data": [], "fn_index": 999, "session_hash": "a"}, 404),
        ({"data": ["a", 1], "fn_index": "0", "session_hash": "a"}, 404),
        ({"data": ["a", 1], "fn_index": True, "session_hash": "a"}, 404),
        ({"data": ["a"], "fn_index": None, "session_hash": "a"}, 404),
        ({"data": ["a", 1], "session_hash": "../../etc"}, 400),
        ({"data": ["a", 1], "session_hash": "x" * 65}, 400),
        ({"data": ["a", 1], "session_hash": None}, 400),
        ({"data": ["a"], "session_hash": "a"}, 400),
        ({"data": ["a", 1], "session_hash": "a", "trigger_id": "x"}, 400),
        ({"data": ["a", 1], "session_hash": "a", "surprise": 1}, 400),
    ],
)
def test_the_body_itself_is_checked(policy: Any, body: Any, status: int) -> None:
    rules, index = policy
    if isinstance(body, dict) and "fn_index" not in body:
        body = {**body, "fn_index": index["py"]}
    assert refusal(rules, body).status == status


def test_a_js_only_event_cannot_be_joined(policy: Any) -> None:
    rules, index = policy
    assert refusal(rules, join(index["js"], [])).status == 404


def test_file_shapes_and_select_data() -> None:
    assert not file_shaped({"index": 1, "value": ["a", {"caption": "b"}]})
    assert file_shaped([[[[{"path": "x"}]]]])
    assert select_data({"index": [1, 2], "selected": False}) == {"index": [1, 2], "value": None, "selected": False}
    assert select_data({"index": -1})["index"] is None and select_data({"index": "0"})["index"] is None
    assert select_data("junk") is None


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (
            "a \ud800 lone surrogate",
            "Parameters text must be valid Unicode text (an unpaired surrogate at character 3)",
        ),
        ("\udfff", "Parameters text must be valid Unicode text (an unpaired surrogate at character 1)"),
        ("bell\x07", "Parameters text must not contain control characters (U+0007 at character 5)"),
        ("nul\x00", "Parameters text must not contain control characters (U+0000 at character 4)"),
        ("c1\x85", "Parameters text must not contain control characters (U+0085 at character 3)"),
        ("del\x7f", "Parameters text must not contain control characters (U+007F at character 4)"),
    ],
)
def test_text_that_is_not_valid_unicode_or_holds_a_control_character_is_refused_naming_the_field(
    policy: Any, value: str, says: str
) -> None:
    rules, index = policy
    refused = refusal(rules, join(index["py"], [value, 1]))
    assert refused.status == 422 and says in str(refused.detail)
    assert refused.detail[0]["parameter_name"] == "pasted" and not refused.detail[0]["is_valid"]


def test_a_surrogate_inside_a_non_text_value_is_refused_too_and_line_breaks_and_tabs_pass(policy: Any) -> None:
    rules, index = policy
    refused = refusal(rules, join(index["py"], ["ok", {"note": ["\ud83d"]}]))
    assert refused.status == 422 and "Seed must be valid Unicode text" in str(refused.detail)
    _event, cleaned = rules.check_join(join(index["py"], ["two\nlines\r\n\twith a tab and an emoji 🎨", 1]))
    assert cleaned["data"][0] == "two\nlines\r\n\twith a tab and an emoji 🎨"
