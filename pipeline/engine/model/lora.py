"""LoRAs in a loaded pipeline: loaded once at start, switched per job, mixed per row in a loop.

``load_loras`` loads every ``--lora`` spec through diffusers' ``load_lora_weights(...,
adapter_name=NAME)`` and refuses, naming the file and why, one that is not a LoRA for this model
(no weight matches a layer, the shapes do not fit, not a weights file). The model is never loaded
again: a job's adapter is set with ``set_adapters`` / ``disable_lora`` (``LoadedLoras.use``), and only
when it differs from the last job's, which costs a few milliseconds (README, "LoRAs").

Under ``--compile`` the LoRAs go through diffusers' hotswap instead (``enable_lora_hotswap``
before the first load): one LoRA slot, its weights copied in place from the chosen LoRA's
state dict, its scale written into the scaling tensors in place, "none" as scale 0, so the
compiled graph never sees a changed module and never recompiles.

A step-level loop may hold members with different LoRAs (``LoadedLoras.rows``): one denoiser call
in which each row goes through its own adapter, through peft's mixed-adapter batches (the
``adapter_names`` argument of every LoRA layer, ``"__base__"`` for no LoRA), with each LoRA's
scale set on its layers. An adapter has one scale at a time, so a loop holds each LoRA at one
scale: the serving side's scheduler admits joiners so (``serving.scheduler.Batch.admits``).
Everything here runs on the model thread.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

from ...errors import ModelRefused
from ...loras import LoraSpec, short_hash
from ...protocol import InferenceJob, LoraInfo, LoraUse

log = logging.getLogger(__name__)

BASE = "__base__"  # peft's name for "no LoRA" in a mixed batch
SLOT = "t2i_hotswap"  # the one LoRA slot under --compile


def use_of(job: InferenceJob) -> LoraUse:
    return LoraUse.of(job.lora, job.lora_scale)


def _lora_layers(module: Any) -> list[Any]:
    from peft.tuners.lora import LoraLayer

    return [m for m in module.modules() if isinstance(m, LoraLayer)]


def _weights_file(source: str) -> Path | None:
    """The local weights file of a source (a file, or the one safetensors file of a folder), if any."""
    path = Path(source).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
        return files[0] if files else None
    try:  # a hub id already in the local cache
        from huggingface_hub import try_to_load_from_cache

        repo, _, weight = _hub_parts(source)
        cached = try_to_load_from_cache(repo, weight or "pytorch_lora_weights.safetensors")
        return Path(cached) if isinstance(cached, str) else None
    except Exception:
        return None


def _hub_parts(source: str) -> tuple[str, str, str]:
    """``user/repo`` or ``user/repo/file.safetensors`` -> (repo id, "", weight file name or "")."""
    parts = source.split("/")
    if len(parts) > 2 and parts[-1].endswith((".safetensors", ".bin")):
        return "/".join(parts[:2]), "", "/".join(parts[2:])
    return source, "", ""


def _load_arguments(spec: LoraSpec) -> tuple[Any, dict[str, Any]]:
    """What ``load_lora_weights`` takes for this source: a local folder or file, or a hub id."""
    path = Path(spec.source).expanduser()
    looks_local = spec.source.startswith(("/", ".", "~")) or path.exists() or "\\" in spec.source
    if looks_local:
        if not path.exists():
            raise ModelRefused(f"--lora {spec.name}: {spec.source} does not exist")
        if path.is_file():
            return str(path.parent), {"weight_name": path.name}
        return str(path), {}
    repo, _, weight = _hub_parts(spec.source)
    return repo, ({"weight_name": weight} if weight else {})


def _refused(spec: LoraSpec, why: str) -> ModelRefused:
    return ModelRefused(f"--lora {spec.name}: {spec.source} is not a LoRA for this model: {why}")


class LoadedLoras:
    """The LoRAs of one pipeline and which one is set now (model thread only)."""

    def __init__(self, pipe: Any, infos: tuple[LoraInfo, ...], *, hotswap: bool = False,
                 states: dict[str, tuple[Any, dict[str, Any]]] | None = None) -> None:  # fmt: skip
        self.pipe = pipe
        self.infos = infos
        self.hotswap = hotswap
        self._states = states or {}  # hotswap: each LoRA's source, loaded into the slot on a switch
        self._current: object = None  # what is set now: a LoraUse, or ("rows", scales)
        self._slot_holds = ""  # hotswap: whose weights are in the slot
        self._unit: dict[int, float] = {}  # hotswap: each layer's scaling at scale 1 (by id)
        self.switches = 0
        self.switch_seconds = 0.0
        denoiser = getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)
        self._denoiser_layers = _lora_layers(denoiser) if denoiser is not None else []
        self._all_layers = [m for c in pipe.components.values() if hasattr(c, "modules") for m in _lora_layers(c)]
        self._rows: list[str] | None = None
        self._hooked = False  # the mixed-batch hooks go in at the first mixed call (never, if no loop mixes)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.infos)

    def _row_names(self, _module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        if self._rows is None:
            return None
        kwargs["adapter_names"] = self._rows
        return args, kwargs

    # -- one LoRA for the whole call ------------------------------------------------------------

    def use(self, use: LoraUse) -> float:
        """Set ``use`` for the next call (nothing if it is set already); returns the milliseconds it took."""
        if self._current == use:
            return 0.0
        t0 = time.perf_counter()
        if self.hotswap:
            self._swap(use)
        elif not use.name:
            self.pipe.disable_lora()
        else:
            self.pipe.enable_lora()
            self.pipe.set_adapters([use.name], [use.scale])
        self._current = use
        spent = time.perf_counter() - t0
        self.switches += 1
        self.switch_seconds += spent
        return spent * 1000

    def _swap(self, use: LoraUse) -> None:
        if use.name and use.name != self._slot_holds:
            source, kwargs = self._states[use.name]  # read again: alphas and key formats as at start
            self.pipe.load_lora_weights(source, adapter_name=SLOT, hotswap=True, **kwargs)
            self._slot_holds = use.name
            self._unit = {id(layer): float(layer.scaling[SLOT]) for layer in self._slot_layers()}
        for layer in self._slot_layers():  # in place: a compiled graph reads the same tensors
            unit = self._unit.get(id(layer), 1.0) * use.scale
            scaling = layer.scaling[SLOT]
            if hasattr(scaling, "fill_"):
                scaling.fill_(unit)
            else:
                layer.scaling[SLOT] = unit

    def _slot_layers(self) -> list[Any]:
        return [layer for layer in self._all_layers if SLOT in layer.scaling]

    # -- a LoRA per row (step-level loops) ---------------------------------------------------------

    @contextlib.contextmanager
    def rows(self, per_row: Sequence[LoraUse]) -> Iterator[None]:
        """The next denoiser call with a LoRA per row (one LoRA for all rows: ``use``)."""
        distinct = set(per_row)
        if len(distinct) == 1 or self.hotswap:
            self.use(per_row[0])
            yield
            return
        scales = {u.name: u.scale for u in distinct if u.name}
        state = ("rows", tuple(sorted(scales.items())))
        if self._current != state:
            t0 = time.perf_counter()
            self.pipe.enable_lora()
            self.pipe.set_adapters(list(scales), list(scales.values()))  # each LoRA's scale on its layers
            self._current = state
            self.switches += 1
            self.switch_seconds += time.perf_counter() - t0
        if not self._hooked:  # adapter_names for every denoiser layer while rows are set
            for layer in self._denoiser_layers:
                layer.register_forward_pre_hook(self._row_names, with_kwargs=True)
            self._hooked = True
        self._rows = [u.name or BASE for u in per_row]
        try:
            yield
        finally:
            self._rows = None


def fitting_loras(pipe: Any, specs: Sequence[LoraSpec], model: str) -> tuple[LoraSpec, ...]:
    """The specs that load into ``pipe`` (several models: each ``--lora`` loads on the models whose
    layers it fits, tried one at a time and unloaded again)."""
    fit: list[LoraSpec] = []
    for spec in specs:
        try:
            load_loras(pipe, [spec])
            fit.append(spec)
        except ModelRefused as exc:
            log.info("--lora %s does not fit %s; not loaded there: %s", spec.name, model, exc)
        finally:
            with contextlib.suppress(Exception):
                pipe.unload_lora_weights()
    return tuple(fit)


def load_loras(pipe: Any, specs: Sequence[LoraSpec], *, hotswap: bool = False) -> LoadedLoras | None:
    """Load every spec into ``pipe`` (refusing a file that is not a LoRA for it); ``None`` without specs."""
    if not specs:
        return None
    if not hasattr(pipe, "load_lora_weights"):
        raise ModelRefused(f"--lora: {type(pipe).__name__} cannot load LoRAs (diffusers has no LoRA loader for it)")
    infos: list[LoraInfo] = []
    states: dict[str, tuple[Any, dict[str, Any]]] = {}
    keys: dict[str, set[str]] = {}
    if hotswap:
        ranks = [_rank(pipe, spec) for spec in specs]
        pipe.enable_lora_hotswap(target_rank=max(ranks), check_compiled="ignore")
    for i, spec in enumerate(specs):
        t0 = time.perf_counter()
        before = _adapter_layers(pipe)
        source, kwargs = _load_arguments(spec)
        try:
            if hotswap:  # every LoRA goes through the slot once now, so a misfit is refused at start
                states[spec.name] = (source, kwargs)
                keys[spec.name] = set(_state_of(pipe, spec))
                if any(not k.startswith(("unet.", "transformer.")) for k in keys[spec.name]):
                    raise ModelRefused(
                        f"--lora {spec.name}: {spec.source} adapts a text encoder too, and under --compile adapters "
                        "are hotswapped, which diffusers cannot do for text encoders: drop --compile, or use "
                        "a LoRA of the denoiser only"
                    )
                pipe.load_lora_weights(source, adapter_name=SLOT, hotswap=i > 0, **kwargs)
            else:
                with warnings.catch_warnings():  # peft warns on every adapter after the first: that is the point
                    warnings.filterwarnings("ignore", message="Already found a `peft_config`")
                    pipe.load_lora_weights(source, adapter_name=spec.name, **kwargs)
        except ModelRefused:
            raise
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise _refused(spec, f"{type(exc).__name__}: {first[:300]}") from exc
        if hotswap:  # one slot for all: the components its keys name
            components = tuple(sorted({k.split(".")[0] for k in keys[spec.name]} & set(pipe.components)))
        else:
            after = _adapter_layers(pipe).items()
            components = tuple(sorted(c for c, names in after if names - before.get(c, set())))
        if not components:
            raise _refused(spec, f"none of its weights matches a layer of {type(pipe).__name__}")
        weights = _weights_file(spec.source)
        infos.append(LoraInfo(spec.name, spec.scale, short_hash(weights) if weights else "", components or ("?",)))
        log.info("LoRA %s from %s (%s) loaded in %.2fs", spec.name, spec.source, ", ".join(components),
                 time.perf_counter() - t0)  # fmt: skip
    loras = LoadedLoras(pipe, tuple(infos), hotswap=hotswap, states=states)
    loras.use(LoraUse())  # no LoRA until a job asks for one
    loras.switches, loras.switch_seconds = 0, 0.0
    return loras


def _adapter_layers(pipe: Any) -> dict[str, set[str]]:
    """Adapter names per component, read from the LoRA layers themselves (what really loaded)."""
    found: dict[str, set[str]] = {}
    for name, component in pipe.components.items():
        if hasattr(component, "modules"):
            names = {a for layer in _lora_layers(component) for a in layer.lora_A}
            if names:
                found[name] = names
    return found


def _state_of(pipe: Any, spec: LoraSpec) -> dict[str, Any]:
    """The LoRA's state dict as diffusers reads it (``lora_state_dict``), or the refusal."""
    source, kwargs = _load_arguments(spec)
    try:
        state = pipe.lora_state_dict(source, **kwargs)
    except Exception as exc:
        raise _refused(spec, f"{type(exc).__name__}: {str(exc).strip()[:300]}") from exc
    return dict(state[0] if isinstance(state, tuple) else state)


def _rank(pipe: Any, spec: LoraSpec) -> int:
    """The LoRA's rank (the largest lora_A's output size), for hotswap's padding."""
    state = _state_of(pipe, spec)
    ranks = [int(v.shape[0]) for k, v in state.items() if any(d in k for d in ("lora_A", "lora_down", "lora.down"))]
    if not ranks:
        raise _refused(spec, "it holds no lora_A/lora_down weights")
    return max(ranks)
