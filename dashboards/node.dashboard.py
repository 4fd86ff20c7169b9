"""Node & GPU: one node's GPUs in detail, from NVML and GPM."""

from __future__ import annotations

from dashboards.common import (
    GPU,
    NODE,
    NOT_SIMULATED,
    ON_GPU,
    PROBE_ONLY,
    Row,
    cluster_var,
    divide,
    gpu_var,
    node_var,
    q,
    stat,
    table,
    timeseries,
)
from dashboards.common import (
    dashboard as make_dashboard,
)

overview = Row(
    "Overview",
    [
        stat(
            "GPUs answering",
            "GPUs whose every collector could read them on its last run, out of all GPUs.",
            [q(f"sum(llmgpu_gpu_up{{{GPU}}})", "up"), q(f"count(llmgpu_gpu_up{{{GPU}}})", "total")],
            text_mode="value_and_name",
            w=4,
        ),
        stat(
            "GPU model",
            "GPU models on the node and how many of each.",
            [q(f"count by (name) (llmgpu_gpu_info{{{GPU}}})", "{{name}}")],
            text_mode="value_and_name",
            w=6,
        ),
        stat(
            "Driver",
            "NVIDIA driver and CUDA version, per distinct pair.",
            [
                q(
                    f"count by (driver_version, cuda_version) (llmgpu_gpu_info{{{GPU}}})",
                    "{{driver_version}} / CUDA {{cuda_version}}",
                )
            ],
            text_mode="name",
            w=4,
        ),
        stat(
            "Power draw",
            "Power drawn by the selected GPUs now.",
            [q(f"sum(llmgpu_gpu_power_watts{{{GPU}}})")],
            unit="watt",
            graph=True,
            w=4,
        ),
        stat(
            "Active findings",
            "Diagnosis findings holding on the node now. The Diagnosis dashboard lists them.",
            [q(f"sum(llmgpu_diagnosis_finding{{{NODE}}})")],
            steps=(("green", None), ("orange", 1)),
            w=3,
        ),
        stat(
            "Simulated",
            "1 when the exporter serves the built-in simulator instead of real GPUs.",
            [q(f"max(llmgpu_exporter_simulated{{{NODE}}})")],
            w=3,
        ),
    ],
)

compute = Row(
    "Compute",
    [
        timeseries(
            "Utilization vs SM active vs tensor active",
            "NVML utilization counts a period as busy when any kernel ran; SM active (GPM) is the "
            "fraction of SMs actually busy and tensor active the fraction of time tensor cores "
            "worked. High utilization with low SM active means small or serial kernels; SMs busy "
            "with idle tensor cores means maths on the FP32/FP16 pipes.",
            [
                q(f"llmgpu_gpu_utilization_ratio{{{GPU}}}", "GPU {{gpu}} utilization"),
                q(f"llmgpu_gpu_sm_active_ratio{{{GPU}}}", "GPU {{gpu}} SM active"),
                q(f"llmgpu_gpu_tensor_active_ratio{{{GPU}}}", "GPU {{gpu}} tensor active"),
            ],
            unit="percentunit",
            max_=1,
            min_=0,
        ),
        timeseries(
            "FP32 pipe activity",
            "The non-tensor FP32 pipe (GPM): busy while tensor cores idle is maths falling back "
            "to FP32. SM occupancy and the FP16 and FP64 pipes are in the full metric profile.",
            [
                q(
                    f"llmgpu_gpu_fp32_active_ratio{{{GPU}}}",
                    "GPU {{gpu}} FP32",
                    scenarios=("healthy", "fp32-fallback"),
                ),
            ],
            unit="percentunit",
            max_=1,
            min_=0,
        ),
        timeseries(
            "DRAM bandwidth saturation",
            "DRAM bandwidth used over the datasheet peak (GPM). The dashed line at 85 % is where "
            "the diagnosis calls the GPU memory-bandwidth bound. NVML's memory busy ratio, the "
            "only signal on GPUs without GPM, is drawn beside it.",
            [
                q(f"llmgpu_gpu_dram_active_ratio{{{GPU}}}", "GPU {{gpu}} DRAM bandwidth"),
                q(f"llmgpu_gpu_memory_busy_ratio{{{GPU}}}", "GPU {{gpu}} memory busy (NVML)"),
            ],
            unit="percentunit",
            max_=1,
            min_=0,
            threshold=0.85,
        ),
        timeseries(
            "DRAM bandwidth achieved",
            "Bytes per second moved to and from DRAM: the GPM ratio times the GPU's datasheet peak, "
            "against that peak.",
            [
                q(
                    f"llmgpu_gpu_dram_active_ratio{{{GPU}}}\n"
                    f"* {ON_GPU} group_left ()\n"
                    f"llmgpu_gpu_dram_bandwidth_peak_bytes_per_second{{{GPU}}}",
                    "GPU {{gpu}}",
                ),
                q(f"max(llmgpu_gpu_dram_bandwidth_peak_bytes_per_second{{{GPU}}})", "peak"),
            ],
            unit="Bps",
        ),
    ],
)

memory = Row(
    "Memory",
    [
        timeseries(
            "Memory used, reserved and free",
            "Framebuffer memory per GPU: used by processes, reserved by the driver and firmware, "
            "free, the total, and the engine's own budget (gpu_memory_utilization times the "
            "total): usage above the budget is something else growing.",
            [
                q(f"llmgpu_gpu_memory_used_bytes{{{GPU}}}", "GPU {{gpu}} used"),
                q(
                    f"max by (gpu) (llmgpu_engine_gpu_memory_budget_bytes{{{GPU}}})",
                    "GPU {{gpu}} engine budget",
                ),
                q(f"llmgpu_gpu_memory_reserved_bytes{{{GPU}}}", "GPU {{gpu}} reserved"),
                q(f"llmgpu_gpu_memory_free_bytes{{{GPU}}}", "GPU {{gpu}} free"),
                q(f"max(llmgpu_gpu_memory_total_bytes{{{GPU}}})", "total"),
            ],
            unit="bytes",
        ),
        table(
            "Engine memory budget",
            "Each engine's KV-cache configuration: gpu_memory_utilization is the share of every "
            "GPU's memory the engine claims for itself (vLLM preallocates it). Usage above "
            "that share plus the CUDA context is something else growing.",
            [q(f"llmgpu_engine_cache_config_info{{{NODE}}}", instant=True, fmt="table")],
            hide=("Time", "__name__", "job", "instance", "cluster", "Value"),
            rename={"gpu_memory_utilization": "Budget (share of GPU memory)"},
        ),
        timeseries(
            "Free memory",
            "Free framebuffer over the total per GPU. The dashed line is the 5 % the diagnosis "
            "counts as low headroom.",
            [
                q(
                    divide(
                        f"llmgpu_gpu_memory_free_bytes{{{GPU}}}", f"llmgpu_gpu_memory_total_bytes{{{GPU}}}"
                    ),
                    "GPU {{gpu}}",
                )
            ],
            unit="percentunit",
            min_=0,
            max_=1,
            threshold=0.05,
        ),
        timeseries(
            "Per-process memory",
            "Memory used by each compute process on each GPU.",
            [q(f"llmgpu_gpu_process_memory_used_bytes{{{GPU}}}", "GPU {{gpu}} pid {{pid}} {{process}}")],
            unit="bytes",
            stack=True,
        ),
        timeseries(
            "Allocator: reserved, allocated, largest free block",
            "From the allocator probe inside the engine (PyTorch caching allocator): memory "
            "reserved from the driver, allocated to tensors, and the largest free block. A "
            "largest block smaller than a batch's activations fails with an OOM although "
            "reserved minus allocated looks large (fragmentation).",
            [
                q(
                    f"llmgpu_allocator_reserved_bytes{{{GPU}}}",
                    "GPU {{gpu}} pid {{pid}} reserved",
                    scenarios=PROBE_ONLY,
                ),
                q(
                    f"llmgpu_allocator_allocated_bytes{{{GPU}}}",
                    "GPU {{gpu}} pid {{pid}} allocated",
                    scenarios=PROBE_ONLY,
                ),
                q(
                    f"llmgpu_allocator_largest_free_block_bytes{{{GPU}}}",
                    "GPU {{gpu}} pid {{pid}} largest free block",
                    scenarios=PROBE_ONLY,
                ),
            ],
            unit="bytes",
        ),
        timeseries(
            "Allocator fragmentation and retries",
            "Fragmentation (1 - largest free block / free reserved memory), allocation retries "
            "after a cache flush and OOMs, per engine process.",
            [
                q(
                    f"llmgpu_allocator_fragmentation_ratio{{{GPU}}}",
                    "GPU {{gpu}} pid {{pid}} fragmentation",
                    scenarios=PROBE_ONLY,
                ),
                q(
                    f"rate(llmgpu_allocator_alloc_retries_total{{{GPU}}}[$__rate_interval])",
                    "GPU {{gpu}} pid {{pid}} retries/s",
                    scenarios=PROBE_ONLY,
                ),
                q(
                    f"rate(llmgpu_allocator_ooms_total{{{GPU}}}[$__rate_interval])",
                    "GPU {{gpu}} pid {{pid}} OOMs/s",
                    scenarios=PROBE_ONLY,
                ),
            ],
        ),
    ],
)

clocks = Row(
    "Clocks, power and temperature",
    [
        timeseries(
            "SM clock",
            "Current SM clock against each GPU's maximum. A clock held below its maximum under "
            "load is explained by the throttle reasons beside.",
            [
                q(f"llmgpu_gpu_sm_clock_hertz{{{GPU}}}", "GPU {{gpu}} SM"),
                q(f"max(llmgpu_gpu_sm_clock_max_hertz{{{GPU}}})", "SM max"),
            ],
            unit="hertz",
        ),
        timeseries(
            "Throttle reasons",
            "Share of time each clock-event reason held the clocks down, per GPU. sw_power_cap "
            "is normal at full load; thermal reasons, hw_slowdown and hw_power_brake are not.",
            [
                q(
                    f"rate(llmgpu_gpu_clock_event_seconds_total{{{GPU}}}[$__rate_interval])",
                    "GPU {{gpu}} {{reason}}",
                    scenarios=("healthy", "thermal-throttle"),
                ),
                q(
                    f"llmgpu_gpu_clock_event_active{{{GPU}}} == 1",
                    "GPU {{gpu}} {{reason}} active now",
                    scenarios=("thermal-throttle", "power-capped"),
                ),
            ],
            unit="percentunit",
            min_=0,
        ),
        timeseries(
            "Power and limit",
            "Power drawn per GPU and its enforced limit.",
            [
                q(f"llmgpu_gpu_power_watts{{{GPU}}}", "GPU {{gpu}}"),
                q(f"llmgpu_gpu_power_limit_watts{{{GPU}}}", "GPU {{gpu}} limit"),
            ],
            unit="watt",
        ),
        timeseries(
            "Temperature",
            "GPU die and HBM temperatures.",
            [
                q(f"llmgpu_gpu_temperature_celsius{{{GPU}}}", "GPU {{gpu}} die"),
                q(f"llmgpu_gpu_memory_temperature_celsius{{{GPU}}}", "GPU {{gpu}} HBM"),
            ],
            unit="celsius",
        ),
    ],
)

interconnect = Row(
    "PCIe and NVLink",
    [
        timeseries(
            "PCIe throughput",
            "Bytes per second over PCIe per GPU, from the cumulative counters (negative = received).",
            [
                q(f"rate(llmgpu_gpu_pcie_tx_bytes_total{{{GPU}}}[$__rate_interval])", "GPU {{gpu}} tx"),
                q(f"-rate(llmgpu_gpu_pcie_rx_bytes_total{{{GPU}}}[$__rate_interval])", "GPU {{gpu}} rx"),
            ],
            unit="Bps",
        ),
        timeseries(
            "PCIe replays",
            "Link replays per second: a link that keeps retrying loses bandwidth. Link generation "
            "and width against their maximum are in the full metric profile.",
            [
                q(
                    f"rate(llmgpu_gpu_pcie_replays_total{{{GPU}}}[$__rate_interval])",
                    "GPU {{gpu}} replays/s",
                    scenarios=("healthy", "pcie-tensor-parallel"),
                ),
            ],
        ),
        timeseries(
            "NVLink throughput from the link counters",
            "Data bytes per second on all links of each GPU (negative = received), from the "
            "cumulative counters: the NVLink load of GPUs without GPM. Per-link counters are in "
            "the full metric profile.",
            [
                q(
                    f"rate(llmgpu_gpu_nvlink_tx_bytes_total{{{GPU}}}[$__rate_interval])",
                    "GPU {{gpu}} tx",
                ),
                q(
                    f"-rate(llmgpu_gpu_nvlink_rx_bytes_total{{{GPU}}}[$__rate_interval])",
                    "GPU {{gpu}} rx",
                ),
            ],
            unit="Bps",
        ),
        timeseries(
            "NVLink throughput per GPU",
            "All links of a GPU together (GPM), against the others: a straggler or an "
            "imbalanced group shows here first.",
            [
                q(f"llmgpu_gpu_nvlink_tx_bytes_per_second{{{GPU}}}", "GPU {{gpu}} tx"),
                q(f"-llmgpu_gpu_nvlink_rx_bytes_per_second{{{GPU}}}", "GPU {{gpu}} rx"),
            ],
            unit="Bps",
        ),
        timeseries(
            "NVLink errors",
            "Errors per second on all links of each GPU, every type together (CRC flit, CRC data, "
            "replay, recovery). Only GPUs with errors are drawn; errors by link and type are in "
            "the full metric profile.",
            [
                q(
                    f"rate(llmgpu_gpu_nvlink_errors_total{{{GPU}}}[$__rate_interval]) > 0",
                    "GPU {{gpu}}",
                    scenarios=NOT_SIMULATED,
                )
            ],
        ),
        timeseries(
            "NVLink links up",
            "Active and sleeping links per GPU against the links it has. A drop on one GPU while "
            "its peers keep theirs is a link failure; a sleeping link is not down.",
            [
                q(f"llmgpu_gpu_nvlink_links_up{{{GPU}}}", "GPU {{gpu}}"),
                q(
                    f"llmgpu_gpu_nvlink_links_sleeping{{{GPU}}} > 0",
                    "GPU {{gpu}} asleep",
                    scenarios=("nvlink-imbalance",),
                ),
                q(f"max(llmgpu_gpu_nvlink_links{{{GPU}}})", "links"),
            ],
        ),
    ],
)

errors = Row(
    "XID and ECC",
    [
        timeseries(
            "XID errors",
            "XID critical errors per GPU and code, counted in each interval. 48, 63, 64, 74, 79, "
            "92, 94 and 95 point at the GPU; 13, 31 and 43 usually at the application.",
            [
                q(
                    "sum by (gpu, xid) (\n"
                    f"  increase(llmgpu_gpu_xid_errors_total{{{GPU}}}[$__rate_interval])\n) > 0",
                    "GPU {{gpu}} XID {{xid}}",
                    scenarios=("gpu-lost",),
                )
            ],
            bars=True,
        ),
        table(
            "XID totals",
            "XIDs seen since the exporter started, per GPU and code.",
            [
                q(
                    f"llmgpu_gpu_xid_errors_total{{{GPU}}} > 0",
                    instant=True,
                    fmt="table",
                    scenarios=("gpu-lost",),
                )
            ],
            hide=("Time", "__name__", "job", "cluster"),
            rename={"Value": "Count"},
        ),
        timeseries(
            "ECC errors",
            "Corrected (single-bit) and uncorrected (double-bit) ECC errors per second.",
            [
                q(
                    f"rate(llmgpu_gpu_ecc_corrected_errors_total{{{GPU}}}[$__rate_interval])",
                    "GPU {{gpu}} corrected",
                    scenarios=("healthy", "ecc-errors"),
                ),
                q(
                    f"rate(llmgpu_gpu_ecc_uncorrected_errors_total{{{GPU}}}[$__rate_interval])",
                    "GPU {{gpu}} uncorrected",
                    scenarios=("healthy", "ecc-errors"),
                ),
            ],
        ),
        timeseries(
            "Row remapping",
            "The pending and failed row-remap flags. A pending remap takes effect at the next "
            "GPU reset; a failed one means replacement. Rows remapped by cause are in the full "
            "metric profile.",
            [
                q(f"llmgpu_gpu_row_remap_pending{{{GPU}}}", "GPU {{gpu}} pending"),
                q(f"llmgpu_gpu_row_remap_failed{{{GPU}}}", "GPU {{gpu}} failed"),
            ],
        ),
    ],
)

partitions = Row(
    "Processes, MIG and engines",
    [
        timeseries(
            "Compute processes",
            "Compute processes per GPU. More than one outside MIG share the memory without "
            "knowing each other's budget.",
            [q(f"llmgpu_gpu_processes{{{GPU}}}", "GPU {{gpu}}")],
        ),
        timeseries(
            "MIG instances: memory",
            "Memory used in each MIG instance against its size.",
            [
                q(
                    f"llmgpu_gpu_mig_memory_used_bytes{{{GPU}}}",
                    "GPU {{gpu}} GI {{gpu_instance}} used",
                    scenarios=("mig",),
                ),
                q(
                    f"llmgpu_gpu_mig_memory_total_bytes{{{GPU}}}",
                    "GPU {{gpu}} GI {{gpu_instance}} size",
                    scenarios=("mig",),
                ),
            ],
            unit="bytes",
        ),
        table(
            "Engines on these GPUs",
            "Which engine (target, model) runs on which GPU, matched from the engine's process "
            "tree to the GPUs' compute processes.",
            [q(f"llmgpu_engine_gpu_info{{{GPU}}}", instant=True, fmt="table")],
            hide=("Time", "__name__", "job", "cluster", "Value"),
        ),
    ],
)

exporter = Row(
    "Exporter",
    [
        timeseries(
            "Collector success",
            "1 when the collector's last run reported no error.",
            [q(f"llmgpu_exporter_collector_success{{{NODE}}}", "{{collector}}")],
            min_=0,
            max_=1,
            w=8,
        ),
        timeseries(
            "Collector duration and sample age",
            "Wall time of each collector's last run, and seconds since it last completed: an "
            "age that keeps growing is a hung collector.",
            [
                q(f"llmgpu_exporter_collector_duration_seconds{{{NODE}}}", "{{collector}} duration"),
                q(f"llmgpu_exporter_collector_sample_age_seconds{{{NODE}}}", "{{collector}} age"),
            ],
            unit="s",
            w=8,
        ),
        timeseries(
            "Collector errors",
            "Errors per second by collector and error name (NVML error or exception type).",
            [
                q(
                    "sum by (collector, error) (\n"
                    f"  rate(llmgpu_exporter_collector_errors_total{{{NODE}}}[$__rate_interval])\n) > 0",
                    "{{collector}} {{error}}",
                    scenarios=("gpu-lost",),
                )
            ],
            w=8,
        ),
    ],
)

dashboard = make_dashboard(
    title="LLM GPU / Node & GPU",
    uid="llmgpu-node",
    description="One node's GPUs: utilization vs SM and tensor activity, DRAM bandwidth, memory, clocks "
    "and throttling, power and heat, PCIe and NVLink, XID and ECC, processes.",
    variables=[cluster_var(), node_var(), gpu_var()],
    rows=[overview, compute, memory, clocks, interconnect, errors, partitions, exporter],
)
