"""``init()``: read a trainer rank's settings, connect the catalog, and join the current generation."""

from __future__ import annotations

import torch

from lifeline.api.pod import TrainerSettings
from lifeline.catalog import Catalog
from lifeline.checkpoint import Layout
from lifeline.errors import ConfigError, LayoutError
from lifeline.runtime._context import RuntimeContext
from lifeline.runtime._rendezvous import Superseded

__all__ = ["init"]


def _layout(settings: TrainerSettings) -> Layout:
    if settings.layout is None:
        return Layout(data=settings.world_size)
    try:
        layout = Layout.from_dict({"tensor": 1, "pipeline": 1, "data": 1, "expert": 1, **settings.layout})
    except LayoutError as err:
        raise ConfigError(f"LIFELINE_LAYOUT: {err.message}", field="layout") from None
    if layout.world_size != settings.world_size:
        raise ConfigError(f"LIFELINE_LAYOUT {layout.to_dict()} has {layout.world_size} ranks but "
                          f"LIFELINE_WORLD_SIZE={settings.world_size}; make the degrees' product equal it",
                          field="layout")
    return layout


def init(settings: TrainerSettings | None = None) -> RuntimeContext:
    """Set up this trainer rank: read its settings, join the job's current process-group generation.

    Reads :class:`~lifeline.api.pod.TrainerSettings` from ``LIFELINE_*`` variables when
    ``settings`` is ``None``. The generation is ``LIFELINE_GENERATION`` or, unset, the catalog's
    current one (a replacement rank joins the generation of the plan that started it).
    The backend is gloo on CPU, plus nccl for CUDA tensors when a GPU exists.

    Raises:
        ConfigError: bad settings (``field`` names the variable), or world size > 1 without a
            ``LIFELINE_REDIS_URL``.
        RecoveryError: the rendezvous did not complete in time.
        CatalogError: Redis is unreachable.
    """
    settings = settings if settings is not None else TrainerSettings.load()
    layout = _layout(settings)
    catalog = None
    if settings.redis_url:
        catalog = Catalog(settings.redis_url, settings.job, settings.world_size, username=settings.redis_username,
                          password=settings.redis_password.get_secret_value())
    elif settings.world_size > 1:
        raise ConfigError("LIFELINE_REDIS_URL is required when LIFELINE_WORLD_SIZE > 1 (the rendezvous goes "
                          "through the catalog)", field="redis_url")
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    ctx = RuntimeContext(settings=settings, layout=layout, rank=settings.rank, world_size=settings.world_size,
                         generation=0, backend=backend, catalog=catalog)
    generation = settings.generation if settings.generation is not None else ctx.current_generation()
    ctx.generation = generation
    ctx.report("init", record=False)
    ctx.recovering(True)  # alive while it joins and restores: off after its first step (runtime/_beat.py)
    while True:
        plan = ctx.plan(generation) if generation > 0 else None
        if not ctx.adopt(plan):  # a kept pod's trainer restarted after a reshard that has no place for its rank
            ctx.retired = True
            ctx.report("retired", world_size=plan.layout.world_size if plan is not None else None)
            return ctx
        try:
            ctx.rejoin(generation)
            return ctx
        except Superseded as sup:  # a reshard changed the layout while joining: adopt it, then join
            generation = sup.generation
