"""Settings from the command line and the environment. The only module that reads ``os.environ``.

Every flag has an environment variable; a flag given on the command line wins over the variable.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .controls import ControlSpec
from .fields import STEP_CACHE_METHODS
from .loras import LoraSpec, parse_all, split_env
from .model_specs import ModelSpec
from .model_specs import parse_all as parse_models

ProxyNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# ``--trusted-proxies auto``: loopback (``--share``'s tunnel connects from 127.0.0.1), and on Spaces also
# the private ranges its proxy comes from (``web.door.identity`` says what a trusted proxy's header means).
LOOPBACK: tuple[str, ...] = ("127.0.0.1/32", "::1/128")
PRIVATE: tuple[str, ...] = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "fc00::/7",
    "fe80::/10",
)


def proxy_networks(text: str | None, *, on_spaces: bool = False) -> tuple[ProxyNetwork, ...]:
    """``--trusted-proxies``: ``auto`` (None or ""), ``none``, or comma-separated addresses and CIDR networks."""
    value = (text or "auto").strip().lower()
    if value == "none":
        return ()
    if value == "auto":
        names: Sequence[str] = LOOPBACK + (PRIVATE if on_spaces else ())
    else:
        names = [part.strip() for part in value.split(",") if part.strip()]
    try:
        return tuple(ipaddress.ip_network(name, strict=False) for name in names)
    except ValueError as exc:
        raise ValueError(f"--trusted-proxies: {exc}; give auto, none or addresses/CIDRs like 10.0.0.0/8") from None


@dataclass(frozen=True)
class Settings:
    model: str | None = None  # the first (default) model's hub id or local path; None: the embedded default model
    # every --model (issue 52): NAME=ID_OR_PATH or ID_OR_PATH, the first the default; (): ``model`` alone
    models: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 7860
    share: bool = False
    mcp: bool = False  # serve /generate as a tool over Gradio's MCP server
    device: str = "auto"  # auto | cuda | mps | cpu
    dtype: str = "auto"  # auto | float32 | float16 | bfloat16
    cpu_offload: bool = False
    attention_slicing: bool = False
    vae_tiling: bool = False
    preview_decoder: Path | None = None  # an AutoencoderTiny folder (TAESD, TAEF1, ...) for sharper previews
    torch_threads: int | None = None  # None: one fewer than the machine's cores (at least 1)
    concurrency: int = 8  # requests in flight (preparing, running, finalizing); derives the waiting cap
    queue_size: int = 32  # requests waiting beyond those; all of them wait in the app's fair line
    max_images: int = 4
    max_batch_size: int = 4  # images in one job across requests (dynamic batching); 1: off
    step_joining: str = "on"  # on: requests join a running denoising loop at step boundaries where the model can; off
    max_waiting_per_user: int | None = None  # requests one user may have in line; None: half of concurrency
    quota_images_per_hour: int | None = None  # images one identity may have in an hour, every protocol; None: off
    max_size: int | None = None  # None: follows the model
    max_steps: int | None = None  # None: follows the model
    max_prompt_chars: int = 2000
    prompt_syntax: str = "a1111"  # a1111: AUTOMATIC1111's weights, BREAK and long prompts; plain: as written
    step_cache: str = "off"  # a request's "default" step cache: off, auto or a method (engine.loop.step_cache)
    max_pixels: int | None = None  # None: max_size squared
    job_timeout: float | None = None  # seconds a job may run on the model; None: derived from the measured rate
    max_pixel_steps: int | None = None  # width × height × steps × images per request; None: 8 default jobs
    trusted_proxies: str | None = None  # auto | none | addresses/CIDRs whose X-Forwarded-For is believed
    rate_limit: float = 4.0  # joins a second per user (bursts of 10 s of it)
    max_sessions_per_user: int = 16  # browser tabs / client sessions open at once per user
    max_connections_per_address: int = 32  # connections (behind a proxy: open requests) per client address
    max_body_kb: int = 1024  # largest request body
    request_timeout: float = 10.0  # seconds for a request's headers; its body gets 3x
    auth: str | None = None  # "user:password"
    metrics_token: str | None = None  # under --auth, /metrics also takes "Authorization: Bearer <token>"
    output_max_mb: int = 1024
    max_users_on_disk: int = 32  # identities with a fixed floor of the disk budget (output_max_mb / this)
    output_key: str | None = None  # the key of the owner folders' names; None: made at first start
    output_max_age_minutes: int = 60
    sweep_interval: float = 30.0
    output_dir: Path = Path(tempfile.gettempdir()) / "t2i-outputs"
    backend: str = "local"  # local: one model side for this server | ray: Ray Serve replicas
    model_side: str = "auto"  # auto | process | thread: where the local backend's model side runs
    compile: bool = False  # torch.compile the denoiser (CUDA: mode="reduce-overhead", i.e. CUDA graphs)
    channels_last: bool = False  # the denoiser and VAE in channels_last memory format
    replicas: int = 1  # Ray backend: model replicas, one device each
    ray_address: str | None = (
        None  # Ray backend: an existing cluster ("auto", "ray://host:10001"); None: start one here
    )
    replica_cpus: float | None = None  # Ray backend: CPUs per replica; None: the cluster's CPUs split evenly
    replica_gpus: float | None = None  # Ray backend: GPUs per replica; None: 1 where the cluster has a GPU per replica
    loras: tuple[str, ...] = ()  # --lora NAME=PATH_OR_HUB_ID[:SCALE] specs (pipeline.loras), in order
    lora_batching: str = "auto"  # auto | mixed | separate: requests with different LoRAs in one loop or not

    controlnets: tuple[str, ...] = ()  # --controlnet NAME=PATH_OR_HUB_ID specs (pipeline.controls), in order
    device_memory_budget: float | None = None  # MiB the models' weights may take on the device; None: from it

    def lora_specs(self) -> tuple[LoraSpec, ...]:
        return parse_all(self.loras)

    def model_specs(self) -> tuple[ModelSpec, ...]:
        """The models to serve, the default first (``model_specs``): every ``--model``, else ``model`` alone."""
        return parse_models(self.models) if self.models else (ModelSpec.parse(self.model),)

    def one_model(self, spec: ModelSpec) -> Settings:
        """These settings for ``spec`` alone (each model loads with the server's other flags)."""
        return dataclasses.replace(self, model=spec.source, models=())

    def control_specs(self) -> tuple[ControlSpec, ...]:
        """The ``--controlnet`` specs (the embedded model's own is added where it loads: ``engine.model.loading``)."""
        from .controls import parse_all as parse_controls

        return parse_controls(self.controlnets)

    def auth_pair(self) -> tuple[str, str] | None:
        if self.auth is None:
            return None
        user, _, password = self.auth.partition(":")
        return user, password

    def resolved_max_waiting_per_user(self) -> int:
        """Default: half of ``concurrency``, and low enough that one user's waiting requests plus a
        full loop of its running ones (``max_batch_size``) leave a handler slot for everyone else."""
        return self.max_waiting_per_user or max(
            1, min(self.concurrency // 2, self.concurrency - self.max_batch_size - 1)
        )

    def admitted(self) -> int:
        """Requests the app holds at once: ``concurrency`` in flight and ``queue_size`` waiting, every one
        of them inside the handler and in the app's fair line; past it, "the queue is full" at once."""
        return self.concurrency + self.queue_size

    def handler_slots(self) -> int:
        """Gradio's ``concurrency_limit`` on the generate events: the admitted requests and room for as
        many again being refused or finishing, so nothing waits in Gradio's arrival-order queue in front
        of the fair line (its ``max_size`` stays a backstop)."""
        return 2 * self.admitted()

    def on_spaces(self) -> bool:
        return bool(os.environ.get("SPACE_ID"))

    def trusted_proxy_networks(self) -> tuple[ProxyNetwork, ...]:
        return proxy_networks(self.trusted_proxies, on_spaces=self.on_spaces())

    def resolved_torch_threads(self) -> int:
        return self.torch_threads or max(1, (os.cpu_count() or 2) - 1)


# (flag, env var, type, help). Booleans are store_true flags; their variables take 1/true/yes.
OPTIONS: tuple[tuple[str, str, type, str], ...] = (
    (
        "model",
        "T2I_MODEL",
        str,
        "hub id or local path of a diffusers text-to-image pipeline or ModularPipeline; "
        "repeatable as NAME=ID_OR_PATH to serve several, the first the default (T2I_MODEL: separated by commas)",
    ),
    ("host", "GRADIO_SERVER_NAME", str, "address to listen on (default 127.0.0.1)"),
    ("port", "GRADIO_SERVER_PORT", int, "port to listen on (default 7860)"),
    ("share", "T2I_SHARE", bool, "create a public share link (use --auth with it)"),
    ("mcp", "T2I_MCP", bool, "serve /generate as a tool over Gradio's MCP server (at /gradio_api/mcp/)"),
    ("device", "T2I_DEVICE", str, "auto, cuda, mps or cpu (default auto: cuda, then mps, then cpu)"),
    ("dtype", "T2I_DTYPE", str, "auto, float32, float16 or bfloat16 (auto: fp16/bf16 on a GPU, fp32 on the CPU)"),
    (
        "device_memory_budget",
        "T2I_DEVICE_MEMORY_BUDGET",
        float,
        "several models: MiB of device memory their "
        "weights may take, the least recently used moved to CPU memory past it (default: the device's memory "
        "less a margin for activations; none on the CPU)",
    ),
    ("cpu_offload", "T2I_CPU_OFFLOAD", bool, "model CPU offload (saves GPU memory, slower)"),
    ("attention_slicing", "T2I_ATTENTION_SLICING", bool, "attention slicing (saves memory, slower)"),
    ("vae_tiling", "T2I_VAE_TILING", bool, "VAE tiling for large images"),
    (
        "preview_decoder",
        "T2I_PREVIEW_DECODER",
        Path,
        "a local AutoencoderTiny folder (TAESD for SD/SDXL, TAESD3, TAEF1) that decodes live previews",
    ),
    ("torch_threads", "T2I_TORCH_THREADS", int, "torch CPU threads (default: cores - 1, at least 1)"),
    ("concurrency", "T2I_CONCURRENCY", int, "requests in flight: preparing, running, finalizing (default 8)"),
    (
        "queue_size",
        "T2I_QUEUE_SIZE",
        int,
        "requests waiting beyond those, in the app's fair line; past both, 'queue full' at once (default 32)",
    ),
    ("max_images", "T2I_MAX_IMAGES", int, "most images per request (default 4)"),
    (
        "max_batch_size",
        "T2I_MAX_BATCH_SIZE",
        int,
        "most images in one inference across compatible waiting requests (default 4; 1 turns batching off)",
    ),
    (
        "step_joining",
        "T2I_STEP_JOINING",
        str,
        "on or off (default on): compatible requests join a running denoising loop at a step boundary, "
        "up to --max-batch-size images (SD and flow-matching families); off: they batch only when a job starts",
    ),
    (
        "max_waiting_per_user",
        "T2I_MAX_WAITING_PER_USER",
        int,
        "most requests one user may have waiting for the GPU; more are refused at once (default: half of "
        "--concurrency, at most --concurrency - --max-batch-size - 1: 3 by default)",
    ),
    (
        "quota_images_per_hour",
        "T2I_QUOTA_IMAGES_PER_HOUR",
        int,
        "most images one identity may have in a sliding hour, counted across the page, gradio_client, MCP, "
        "/sdapi/v1 and /v1/images; past it, 429 with Retry-After (default: off)",
    ),
    ("max_size", "T2I_MAX_SIZE", int, "largest width/height in pixels (default: follows the model)"),
    ("max_steps", "T2I_MAX_STEPS", int, "most denoising steps (default: follows the model)"),
    ("max_prompt_chars", "T2I_MAX_PROMPT_CHARS", int, "longest prompt in characters (default 2000)"),
    (
        "prompt_syntax",
        "T2I_PROMPT_SYNTAX",
        str,
        "a1111 (AUTOMATIC1111's (word:1.2), [word], BREAK, and CLIP prompts past 75 tokens in chunks) or plain "
        "(every prompt read as written); a request's emphasis field overrides it (default a1111)",
    ),
    (
        "step_cache",
        "T2I_STEP_CACHE",
        str,
        "the step cache a request gets unless it names one: off, auto (the model's recommended method) or "
        "taylorseer or reuse, where the model's step-level loops run them (default off)",
    ),
    ("max_pixels", "T2I_MAX_PIXELS", int, "most width × height pixels (default: max size squared)"),
    (
        "job_timeout",
        "T2I_JOB_TIMEOUT",
        float,
        "seconds a job may run on the model before it is stopped (default: derived from the measured "
        "step rate, twice the job's expected time plus 30 s, and 10 minutes before anything is measured)",
    ),
    (
        "max_pixel_steps",
        "T2I_MAX_PIXEL_STEPS",
        int,
        "most width × height × steps × images one request may ask for (default: 8 of the model's default job)",
    ),
    (
        "trusted_proxies",
        "T2I_TRUSTED_PROXIES",
        str,
        "auto, none, or comma-separated addresses/CIDRs of proxies whose X-Forwarded-For is believed "
        "(default auto: 127.0.0.1 and ::1, and on Spaces the private ranges its proxy comes from)",
    ),
    ("rate_limit", "T2I_RATE_LIMIT", float, "joins a second per user; bursts up to 10 s of it (default 4)"),
    (
        "max_sessions_per_user",
        "T2I_MAX_SESSIONS_PER_USER",
        int,
        "sessions (browser tabs, clients) one user may have open (default 16)",
    ),
    (
        "max_connections_per_address",
        "T2I_MAX_CONNECTIONS_PER_ADDRESS",
        int,
        "connections one address may have open; behind a trusted proxy, open requests (default 32)",
    ),
    ("max_body_kb", "T2I_MAX_BODY_KB", int, "largest request body in KiB (default 1024)"),
    (
        "request_timeout",
        "T2I_REQUEST_TIMEOUT",
        float,
        "seconds a client may take to send a request's headers; its body gets three times that (default 10)",
    ),
    ("auth", "T2I_AUTH", str, "user:password required to use the app (recommended with --share)"),
    (
        "metrics_token",
        "T2I_METRICS_TOKEN",
        str,
        "under --auth, a bearer token that /metrics also accepts (for a Prometheus scraper); /health stays open",
    ),
    ("output_max_mb", "T2I_OUTPUT_MAX_MB", int, "disk budget for generated images, in MiB (default 1024)"),
    (
        "max_users_on_disk",
        "T2I_MAX_USERS_ON_DISK",
        int,
        "identities each kept a fixed floor of the disk budget (the budget over this); more are served, "
        "and their images deleted first (default 32)",
    ),
    (
        "output_key",
        "T2I_OUTPUT_KEY",
        str,
        "secret that names the owner folders in image URLs (default: made at first start, kept in the "
        "output folder); give one to replicas that share a folder",
    ),
    (
        "output_max_age_minutes",
        "T2I_OUTPUT_MAX_AGE_MINUTES",
        int,
        "generated images older than this are deleted (default 60)",
    ),
    ("sweep_interval", "T2I_SWEEP_INTERVAL", float, "seconds between sweeps of the output folders (default 30)"),
    ("output_dir", "T2I_OUTPUT_DIR", Path, "folder for generated PNGs (default: $TMPDIR/t2i-outputs)"),
    (
        "backend",
        "T2I_BACKEND",
        str,
        "local (the model in this process) or ray (Ray Serve replicas; pip install 'ray[serve]')",
    ),
    (
        "model_side",
        "T2I_MODEL_SIDE",
        str,
        "local backend: process (the model in its own process, restarted if it dies), thread (in this "
        "process, for debugging) or auto (process; thread on ZeroGPU, whose @spaces.GPU is the process "
        "boundary there) (default auto)",
    ),
    (
        "compile",
        "T2I_COMPILE",
        bool,
        "torch.compile the denoiser (on CUDA with mode=reduce-overhead: CUDA graphs); the first jobs are slow",
    ),
    (
        "channels_last",
        "T2I_CHANNELS_LAST",
        bool,
        "channels_last memory format for the denoiser and the VAE (helps convolutional models on some GPUs)",
    ),
    (
        "replicas",
        "T2I_REPLICAS",
        int,
        "Ray backend: model replicas, one device and one inference at a time each (default 1)",
    ),
    (
        "ray_address",
        "T2I_RAY_ADDRESS",
        str,
        "Ray backend: address of an existing Ray cluster (default: start a local one)",
    ),
    (
        "replica_cpus",
        "T2I_REPLICA_CPUS",
        float,
        "Ray backend: CPUs per replica (default: the cluster's CPUs split evenly)",
    ),
    (
        "replica_gpus",
        "T2I_REPLICA_GPUS",
        float,
        "Ray backend: GPUs per replica (default: 1 where the cluster has one per replica, else 0)",
    ),
)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _env_value(name: str, kind: type, raw: str) -> object:
    if kind is bool:
        low = raw.strip().lower()
        if low not in _TRUE | _FALSE:
            raise SystemExit(f"{name} must be one of 1/0, true/false, yes/no; got {raw!r}")
        return low in _TRUE
    try:
        return kind(raw)
    except ValueError:
        raise SystemExit(f"{name} must be a {kind.__name__}; got {raw!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Text-to-image demo: one GPU, many users.",
        epilog="Every flag also reads the environment variable named in its help.",
    )
    parser.add_argument(
        "--lora",
        dest="loras",
        action="append",
        default=None,
        metavar="NAME=PATH_OR_HUB_ID[:SCALE]",
        help="a LoRA loaded at start that requests may pick by NAME (repeatable; SCALE: the scale "
        "the page suggests for it, default 1) [T2I_LORAS: specs separated by commas or line breaks]",
    )
    parser.add_argument(
        "--controlnet",
        dest="controlnets",
        action="append",
        default=None,
        metavar="NAME=PATH_OR_HUB_ID",
        help="a ControlNet loaded at start that requests may pick by NAME (repeatable; it must fit the "
        "model's family; the embedded model loads its own, shapes) [T2I_CONTROLNETS: specs separated by "
        "commas or line breaks]",
    )
    parser.add_argument(
        "--lora-batching",
        dest="lora_batching",
        default=None,
        help="auto, mixed or separate: requests with different LoRAs share a step-level loop's "
        "denoiser calls, a LoRA per row (mixed), or run a loop per LoRA (separate); auto: mixed "
        "where the model's loop can, separate under --compile [T2I_LORA_BATCHING]",
    )
    for dest, env, kind, text in OPTIONS:
        flag = "--" + dest.replace("_", "-")
        if kind is bool:
            parser.add_argument(flag, dest=dest, action="store_true", default=None, help=f"{text} [{env}]")
        elif dest == "model":  # several models (issue 52)
            parser.add_argument(flag, dest=dest, action="append", default=None, help=f"{text} [{env}]")
        else:
            parser.add_argument(flag, dest=dest, type=kind, default=None, help=f"{text} [{env}]")
    return parser


def load_settings(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Flags win over environment variables, which win over the defaults."""
    environ = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    values: dict[str, object] = {}
    for dest, env, kind, _ in OPTIONS:
        flag_value = getattr(args, dest)
        if flag_value is not None:
            values[dest] = flag_value
        elif environ.get(env) not in (None, ""):
            values[dest] = _env_value(env, kind, environ[env])
    models = args.model if args.model is not None else split_env(environ.get("T2I_MODEL", ""))
    values.pop("model", None)
    if models:
        values["models"] = tuple(models) if len(models) > 1 or "=" in models[0] else ()
        try:
            values["model"] = ModelSpec.parse(models[0]).source
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
    if args.loras is not None:
        values["loras"] = tuple(args.loras)
    elif environ.get("T2I_LORAS", "").strip():
        values["loras"] = tuple(split_env(environ["T2I_LORAS"]))
    if args.controlnets is not None:
        values["controlnets"] = tuple(args.controlnets)
    elif environ.get("T2I_CONTROLNETS", "").strip():
        values["controlnets"] = tuple(split_env(environ["T2I_CONTROLNETS"]))
    if args.lora_batching is not None or environ.get("T2I_LORA_BATCHING"):
        values["lora_batching"] = args.lora_batching or environ["T2I_LORA_BATCHING"]
    settings = Settings(**values)  # type: ignore[arg-type]
    _check(settings)
    return settings


def _check(s: Settings) -> None:
    if s.device not in {"auto", "cuda", "mps", "cpu"}:
        raise SystemExit(f"--device must be auto, cuda, mps or cpu; got {s.device!r}")
    if s.dtype not in {"auto", "float32", "float16", "bfloat16"}:
        raise SystemExit(f"--dtype must be auto, float32, float16 or bfloat16; got {s.dtype!r}")
    if not 0 < s.port < 65536:
        raise SystemExit(f"--port must be between 1 and 65535; got {s.port}")
    names: tuple[str, ...] = ("concurrency", "queue_size", "max_images", "max_batch_size", "max_prompt_chars")
    names += ("max_sessions_per_user", "max_connections_per_address", "max_body_kb", "max_users_on_disk")
    for name in names:
        if getattr(s, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1; got {getattr(s, name)}")
    if s.max_waiting_per_user is not None and s.max_waiting_per_user < 1:
        raise SystemExit(f"--max-waiting-per-user must be at least 1; got {s.max_waiting_per_user}")
    if s.quota_images_per_hour is not None and s.quota_images_per_hour < 1:
        raise SystemExit(f"--quota-images-per-hour must be at least 1; got {s.quota_images_per_hour}")
    if s.max_pixel_steps is not None and s.max_pixel_steps < 1:
        raise SystemExit(f"--max-pixel-steps must be at least 1; got {s.max_pixel_steps}")
    if not s.request_timeout > 0:
        raise SystemExit(f"--request-timeout must be a positive number of seconds; got {s.request_timeout}")
    if not s.rate_limit > 0:
        raise SystemExit(f"--rate-limit must be a positive number of joins a second; got {s.rate_limit}")
    try:
        proxy_networks(s.trusted_proxies)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if s.auth is not None and (":" not in s.auth or s.auth.startswith(":") or s.auth.endswith(":")):
        raise SystemExit("--auth must be user:password")
    if s.job_timeout is not None and not s.job_timeout > 0:
        raise SystemExit(f"--job-timeout must be a positive number of seconds; got {s.job_timeout}")
    for name in ("output_max_mb", "output_max_age_minutes"):
        if getattr(s, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1; got {getattr(s, name)}")
    if not s.sweep_interval > 0:
        raise SystemExit(f"--sweep-interval must be a positive number of seconds; got {s.sweep_interval}")
    if s.backend not in {"local", "ray"}:
        raise SystemExit(f"--backend must be local or ray; got {s.backend!r}")
    if s.model_side not in {"auto", "process", "thread"}:
        raise SystemExit(f"--model-side must be auto, process or thread; got {s.model_side!r}")
    if s.prompt_syntax not in {"a1111", "plain"}:
        raise SystemExit(f"--prompt-syntax must be a1111 or plain; got {s.prompt_syntax!r}")
    if s.step_cache not in {"off", "auto", *STEP_CACHE_METHODS}:
        methods = ", ".join(("off", "auto", *STEP_CACHE_METHODS))
        raise SystemExit(f"--step-cache must be one of {methods}; got {s.step_cache!r}")
    if s.step_joining not in {"on", "off"}:
        raise SystemExit(f"--step-joining must be on or off; got {s.step_joining!r}")
    if s.replicas < 1:
        raise SystemExit(f"--replicas must be at least 1; got {s.replicas}")
    if s.backend == "local" and (s.replicas != 1 or s.ray_address):
        raise SystemExit("--replicas and --ray-address need --backend ray")
    for name in ("replica_cpus", "replica_gpus"):
        value = getattr(s, name)
        if value is not None and not value >= 0:
            raise SystemExit(f"--{name.replace('_', '-')} must be 0 or more; got {value}")
    if s.lora_batching not in {"auto", "mixed", "separate"}:
        raise SystemExit(f"--lora-batching must be auto, mixed or separate; got {s.lora_batching!r}")
    try:
        s.lora_specs()
        s.control_specs()
        s.model_specs()
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if s.device_memory_budget is not None and not s.device_memory_budget > 0:
        raise SystemExit(f"--device-memory-budget must be a positive number of MiB; got {s.device_memory_budget}")
    if s.concurrency < 2:
        raise SystemExit("--concurrency must be at least 2, or the whole handler is serialized")
