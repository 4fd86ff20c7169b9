"""The runner's precedence is explicit: GPM beats a dcgm-exporter field by field, whatever
the collectors' names, and each GPU says which source gave each profiling metric."""

from __future__ import annotations

from exporter.collectors.base import Collector, Output
from exporter.gpu_readings import DeviceFacts, MetricSources, Power, Profiling
from exporter.runner import Runner
from exporter.web.exposition import Exposure

SOURCES = Exposure.of("default", enabled=("llmgpu_gpu_metric_source",))  # full-profile family, on


class Fixed(Collector):
    def __init__(self, name: str, precedence: int, out: Output) -> None:
        self.name, self.precedence, self.out = name, precedence, out

    def collect(self) -> Output:
        return self.out


FACTS = DeviceFacts(uuid="GPU-a", labels={"name": "NVIDIA A100-SXM4-80GB"})
# "aaa" sorts first, so by name alone "zzz" would win; its lower precedence must lose
HIGH = Fixed("aaa", 0, Output(gpus={0: (FACTS, Profiling(sm_active_ratio=None, dram_active_ratio=0.3))}))
LOW = Fixed(
    "zzz",
    -1,
    Output(
        by_uuid={
            "GPU-a": (Profiling(sm_active_ratio=0.7, dram_active_ratio=0.9), Power(usage_watts=1.0)),
            "GPU-elsewhere": (Profiling(sm_active_ratio=0.1),),
        }
    ),
)


def sources(runner: Runner) -> dict[str, str]:
    ms = runner.step().snapshot.gpus[0].get(MetricSources)
    assert ms is not None
    return {i.metric: i.source for i in ms.items}


def test_higher_precedence_wins_field_by_field_and_says_so() -> None:
    runner = Runner([HIGH, LOW], interval=1.0, gpu_count=1, exposure=SOURCES)
    g = runner.step().snapshot.gpus[0]
    p = g.get(Profiling)
    assert p is not None and p.dram_active_ratio == 0.3 and p.sm_active_ratio == 0.7
    assert sources(runner) == {"llmgpu_gpu_dram_active_ratio": "aaa", "llmgpu_gpu_sm_active_ratio": "zzz"}
    assert g.supported["gpm"] and g.supported["sources"]


def test_collector_order_does_not_matter() -> None:
    a = Runner([HIGH, LOW], interval=1.0, gpu_count=1).step().snapshot.gpus[0].get(Profiling)
    b = Runner([LOW, HIGH], interval=1.0, gpu_count=1).step().snapshot.gpus[0].get(Profiling)
    assert a == b


def test_readings_by_uuid_land_on_that_gpu_only() -> None:
    snap = Runner([HIGH, LOW], interval=1.0, gpu_count=2).step().snapshot
    assert snap.gpus[0].get(Power) == Power(usage_watts=1.0)  # not a merged class: placed whole
    assert snap.gpus[1].get(Profiling) is None  # GPU-elsewhere is not on this node


def test_equal_precedence_keeps_the_old_rule_later_name_wins_whole_readings() -> None:
    one = Fixed("aaa", 0, Output(gpus={0: (FACTS, Power(usage_watts=5.0))}))
    two = Fixed("bbb", 0, Output(gpus={0: (Power(usage_watts=7.0, limit_watts=9.0),)}))
    assert Runner([one, two], interval=1.0, gpu_count=1).step().snapshot.gpus[0].get(Power) == Power(
        usage_watts=7.0, limit_watts=9.0
    )


GPM_AND_DCGM = """
name: h100-gpm-and-dcgm
gpus: {count: 1, model: H100-80GB-SXM}
dcgm_exporter: {interval: 10}
phases: [{name: p, duration: 100, gpu: {util: 0.9, sm_active: 0.5, dram_active: 0.6, tensor_active: 0.3}}]
"""


def test_an_h100_with_both_sources_is_profiled_by_gpm(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(GPM_AND_DCGM, metrics_enabled=("llmgpu_gpu_metric_source",))
    s.at(10)
    snap = s.at(20)  # GPM has two samples now; the dcgm-exporter its first window
    ms = snap.gpus[0].get(MetricSources)
    assert ms is not None and {i.source for i in ms.items} == {"gpm"}
    assert len(ms.items) == 11


def test_sources_are_worked_out_only_where_they_are_written() -> None:
    # llmgpu_gpu_metric_source is in the full profile: the default one neither writes nor builds it
    g = Runner([HIGH, LOW], interval=1.0, gpu_count=1).step().snapshot.gpus[0]
    assert g.get(MetricSources) is None and "sources" not in g.supported
    assert g.get(Profiling) == Profiling(sm_active_ratio=0.7, dram_active_ratio=0.3)
