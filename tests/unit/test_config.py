from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import load_settings


def test_defaults() -> None:
    s = load_settings([], environ={})
    assert (s.host, s.port, s.share, s.model, s.device) == ("127.0.0.1", 7860, False, None, "auto")
    assert s.concurrency > 1 and s.queue_size > 0


def test_environment_then_flags() -> None:
    env = {
        "GRADIO_SERVER_NAME": "0.0.0.0",
        "GRADIO_SERVER_PORT": "9000",
        "T2I_MODEL": "stabilityai/sd-turbo",
        "T2I_CPU_OFFLOAD": "1",
        "T2I_OUTPUT_DIR": "/tmp/x",
    }
    s = load_settings([], environ=env)
    assert (s.host, s.port, s.model, s.cpu_offload, s.output_dir) == (
        "0.0.0.0",
        9000,
        "stabilityai/sd-turbo",
        True,
        Path("/tmp/x"),
    )
    s = load_settings(["--port", "9100", "--model", "./local", "--share", "--vae-tiling"], environ=env)
    assert (s.port, s.model, s.share, s.vae_tiling) == (9100, "./local", True, True)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--device", "tpu"], {}, "--device must be"),
        (["--port", "0"], {}, "--port must be"),
        (["--concurrency", "1"], {}, "--concurrency must be at least 2"),
        ([], {"T2I_CPU_OFFLOAD": "maybe"}, "T2I_CPU_OFFLOAD must be one of"),
        ([], {"GRADIO_SERVER_PORT": "http"}, "GRADIO_SERVER_PORT must be a int"),
        (["--backend", "k8s"], {}, "--backend must be local or ray"),
        (["--backend", "ray", "--replicas", "0"], {}, "--replicas must be at least 1"),
        (["--replicas", "2"], {}, "need --backend ray"),
        (["--backend", "ray", "--replica-gpus", "-1"], {}, "--replica-gpus must be 0 or more"),
    ],
)
def test_bad_settings_exit_with_a_message(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        load_settings(argv, environ=env)


def test_ray_settings_from_flags_and_environment() -> None:
    env = {"T2I_BACKEND": "ray", "T2I_REPLICAS": "4", "T2I_RAY_ADDRESS": "auto"}
    s = load_settings(["--replica-gpus", "1"], environ=env)
    assert (s.backend, s.replicas, s.ray_address, s.replica_gpus, s.replica_cpus) == ("ray", 4, "auto", 1.0, None)


def test_replica_resources_split_the_cluster() -> None:
    from pipeline.config import Settings
    from pipeline.ray.cluster import replica_resources

    two = Settings(backend="ray", replicas=2)
    assert replica_resources(two, {"CPU": 2}) == (1.0, 0.0)
    assert replica_resources(two, {"CPU": 32, "GPU": 2}) == (16.0, 1.0)
    assert replica_resources(two, {"CPU": 32, "GPU": 1}) == (16.0, 0.0)  # not one GPU each: CPU replicas
    assert replica_resources(Settings(backend="ray", replicas=2, device="cpu"), {"CPU": 8, "GPU": 4}) == (4.0, 0.0)
    assert replica_resources(Settings(backend="ray", replicas=3, replica_cpus=0.5, replica_gpus=0.25), {"CPU": 1}) == (
        0.5,
        0.25,
    )


def test_the_default_waiting_cap_leaves_other_users_a_handler_slot() -> None:
    """Half of --concurrency, and never so many that one user's waiting requests and a full loop of
    its running ones (--max-batch-size) fill every handler slot."""
    from pipeline.config import load_settings

    def cap(*argv: str) -> int:
        return load_settings(list(argv), environ={}).resolved_max_waiting_per_user()

    assert cap() == 3  # concurrency 8, max batch 4: 3 waiting + 4 running leaves 1 slot
    assert cap("--max-batch-size", "1") == 4 and cap("--concurrency", "16") == 8 and cap("--concurrency", "2") == 1
    assert cap("--max-waiting-per-user", "6") == 6
    for concurrency, batch in ((8, 4), (12, 8), (32, 4), (6, 2)):
        assert cap("--concurrency", str(concurrency), "--max-batch-size", str(batch)) + batch < concurrency
