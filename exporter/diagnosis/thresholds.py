"""Every number the diagnosis compares against, in one typed place.

Ratios are 0-1, times are seconds, rates are per second unless the name says otherwise.
Each value carries the reason it was chosen; docs/diagnosis.md shows the same table.
`hold_s` is how long a condition must hold before its finding fires, `clear_s` how long
it must be absent before the finding clears (the two together stop flapping).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class Thresholds:
    # ---- capacity ---------------------------------------------------------------------
    # SM active above 95 % for three minutes is saturation (the usual capacity-planning line). Short bursts at
    # 100 % are normal during prefill; three minutes means the queue, not a burst.
    sm_saturation_ratio: float = 0.95
    sm_saturation_hold_s: float = 180.0
    # The throughput knee needs load that moved: the highest offered rate in the history
    # at least twice the lowest, else there is no curve to read a knee from.
    knee_min_samples: int = 30
    knee_min_rate_span: float = 2.0
    knee_bins: int = 6
    # Past the knee each extra request per second buys less than a quarter of the
    # tokens/s it bought at low load ...
    knee_slope_drop_ratio: float = 0.25
    # ... while the p99 time to first token at least doubles against low load.
    knee_latency_jump_factor: float = 2.0
    # The knee is read from minutes of history already; one more minute confirms it.
    knee_hold_s: float = 60.0
    # An engine that crashed or was restarted should answer again within 10 s (weights
    # from a local cache, compile and CUDA-graph caches kept); longer takes its share of
    # the node's capacity away for that long. The finding stays ten minutes after the
    # engine came back, like an XID, long enough for an alert and a person to see it.
    recovery_target_s: float = 10.0
    recovery_window_s: float = 600.0

    # ---- hardware ---------------------------------------------------------------------
    # NVML "utilization" counts a sample as busy when any kernel ran on any SM; with SM
    # activity (GPM) under 30 % while that reads above 80 %, most SMs sit idle behind
    # small or serial kernels.
    busy_util_min_ratio: float = 0.8
    busy_sm_active_max_ratio: float = 0.3
    busy_idle_hold_s: float = 120.0
    # GPM DRAM bandwidth utilisation is measured / datasheet peak. Above 85 % of peak the
    # memory system is the limit: HBM rarely sustains more than ~90 % in practice.
    dram_bound_ratio: float = 0.85
    dram_bound_hold_s: float = 120.0
    # A throttle reason held for a minute is a cooling or power problem, not a spike.
    throttle_hold_s: float = 60.0
    # Power capping is normal at full load; it matters when it costs clock speed: SM
    # clock held below 85 % of its maximum.
    power_throttle_clock_max_ratio: float = 0.85
    # DCGM's health check flags more than 8 PCIe replays per minute; averaged over five
    # minutes so a single burst does not fire it.
    pcie_replays_per_minute: float = 8.0
    pcie_replay_window_s: float = 300.0
    pcie_replay_hold_s: float = 60.0
    # XIDs after which the GPU needs a reset or replacement: 48 double-bit ECC, 79 fallen
    # off the bus, 94/95 contained/uncontained ECC, 92 high single-bit ECC rate, 64 row
    # remap failure, 74 NVLink error.
    xid_fatal: tuple[int, ...] = (48, 64, 74, 79, 92, 94, 95)
    # XIDs that follow memory trouble in the application: 31 MMU fault (bad address, often
    # right after an OOM path), 43 GPU stopped processing (the context was killed).
    xid_memory: tuple[int, ...] = (31, 43)
    # An XID stays a finding for ten minutes after it was seen, long enough for a scrape
    # interval, an alert and a person to notice it.
    xid_window_s: float = 600.0
    ecc_window_s: float = 600.0
    # A GPU that stopped answering NVML for 15 s is not a transient timeout.
    gpu_lost_hold_s: float = 15.0
    # A placement does not change by itself; a minute rules out a process being moved.
    numa_hold_s: float = 60.0

    # ---- kernel -----------------------------------------------------------------------
    # SMs more than half busy while tensor cores do under 10 % of the work: matrix maths
    # runs on the FP32/FP16 pipes (wrong dtype, a kernel without tensor-core path).
    tensor_sm_active_min_ratio: float = 0.5
    tensor_active_max_ratio: float = 0.1
    tensor_hold_s: float = 180.0
    # Decode typically reaches 30-60 % of peak bandwidth (MBU), prefill 30-60 % of peak
    # FLOP/s (MFU). Busy GPUs that reach neither 10 % MFU nor 20 % MBU spend their time
    # on launches, syncs and small kernels.
    mfu_min_ratio: float = 0.1
    mbu_min_ratio: float = 0.2
    mfu_busy_util_min_ratio: float = 0.8
    mfu_hold_s: float = 180.0
    # Counters turn into rates over a minute of snapshots (the engines' own derived
    # rates use the same window).
    rate_window_s: float = 60.0

    # ---- memory -----------------------------------------------------------------------
    # KV usage at 95 % with more than 3 preemptions a minute: the scheduler is evicting
    # running sequences to admit others and recomputing them later.
    kv_usage_min_ratio: float = 0.95
    kv_preemptions_min_per_second: float = 0.05
    kv_hold_s: float = 60.0
    # With nothing running or waiting, vLLM's KV usage falls to about 0: finished
    # requests' blocks go back to the free queue (prefix-cached ones stay evictable and
    # count as free). 10 % still in use after two idle minutes is a leak.
    kv_leak_min_ratio: float = 0.1
    kv_leak_hold_s: float = 120.0
    # OOM risk. Free framebuffer below 5 % of the total counts as low headroom: vLLM at
    # its default gpu_memory_utilization 0.9 leaves 10 %, so that alone stays quiet.
    oom_free_margin_ratio: float = 0.05
    # Usage above the engine's own budget by more than 2 % of the framebuffer (CUDA
    # context and NCCL buffers live outside vLLM's accounting and take about that).
    oom_budget_tolerance_ratio: float = 0.02
    # The trend of free memory is fitted over five minutes; a time to full under 30
    # minutes scores, under a minute scores 1.
    oom_trend_window_s: float = 300.0
    oom_trend_min_span_s: float = 60.0
    oom_time_to_full_horizon_s: float = 1800.0
    # Weights of the reasons, combined as 1 - prod(1 - w). Low headroom and GPU sharing
    # stay below the finding alone and together; fragmentation crosses it with either.
    # (A full KV cache is no reason: vLLM preallocates it, and a full cache preempts.)
    oom_low_headroom_weight: float = 0.3
    oom_fragmentation_weight: float = 0.5
    oom_shared_weight: float = 0.3
    # Fragmentation (allocator probe): the largest free block must fit an activation
    # buffer of a full batch; 512 MiB covers an 8k-token batch of a 70B model's MLP
    # intermediate in bf16. It counts when at least half the free memory is unusable
    # for it. An allocator OOM already counted (`ooms_total` rising) scores 1.
    oom_typical_request_bytes: int = 512 * 1024 * 1024
    oom_fragmentation_min_ratio: float = 0.5

    # Burst headroom. Engines whose memory budgets leave 20 % of the GPU or more
    # (gpu_memory_utilization 0.8 or less) keep that room on purpose, for bursts outside
    # them: a second process, activations beyond vLLM's profile. With less than half of
    # it free for three minutes the room is gone, not briefly borrowed by a burst. Below
    # 20 % (vLLM's default 0.9 leaves 10 %) the rest is the CUDA context and NCCL
    # buffers, not room for bursts, and vLLM's preallocation absorbs its own: no check.
    headroom_planned_min_ratio: float = 0.2
    headroom_kept_min_share: float = 0.5
    headroom_hold_s: float = 180.0

    # The finding fires at 0.6: usage well beyond the budget, free memory heading for
    # zero within about 13 minutes, or weaker reasons adding up. It clears after two minutes
    # below, since memory freed by a restart needs a moment to show in NVML.
    oom_finding_ratio: float = 0.6
    # The exported score is the highest of the last minute (a windowed maximum): it rises
    # at once and falls after a minute without the reason, so alerts on it do not flap
    # with a storm in waves. The finding judges each frame's own score over its hold.
    oom_smooth_s: float = 60.0
    oom_hold_s: float = 60.0
    oom_clear_s: float = 120.0

    # ---- scheduling -------------------------------------------------------------------
    # At least 5 waiting requests, not shrinking over a minute, while SMs are less than
    # half busy and the KV cache under 80 %: the GPUs could take more, the scheduler
    # does not give it to them.
    queue_waiting_min: float = 5.0
    queue_sm_active_max_ratio: float = 0.5
    queue_kv_usage_max_ratio: float = 0.8
    queue_hold_s: float = 120.0
    # A limit binds the queue when running requests reach 90 % of it (max_num_seqs, the
    # KV cache's full-length concurrency): the scheduler admits nothing more.
    queue_limit_near_ratio: float = 0.9
    # A Python API server cannot use more than one core (GIL); at 90 % of one core it is
    # the bottleneck for tokenisation, detokenisation and streaming.
    api_cpu_min_ratio: float = 0.9
    api_cpu_hold_s: float = 120.0
    # More than one rejection every ten seconds over a minute is not a stray request.
    rejections_min_per_second: float = 0.1
    rejections_hold_s: float = 60.0
    # Prefill/decode disaggregation out of balance: a prefill engine with 5 or more waiting
    # requests and its GPUs 85 % active or more, while every decode engine of the model has
    # its GPUs under 40 % active and nothing in its prealloc or transfer queue (no request
    # is on its way to it): prefill capacity sets the throughput, decode GPUs idle. Two
    # minutes tells a lasting mix of long prompts from one burst of them.
    pd_prefill_waiting_min: float = 5.0
    pd_prefill_busy_min_ratio: float = 0.85
    pd_decode_idle_max_ratio: float = 0.4
    pd_hold_s: float = 120.0

    # A noisy neighbour: another tenant of the engine's GPU (time-slicing, MPS) takes at
    # least half of the SM time its processes use, or half of the memory in use, while the
    # engine's median inter-token or first-token latency is 1.5 times its best of the last
    # ten minutes (or its generation throughput two thirds of its best, with no fewer
    # requests in flight). Half is where the engine no longer gets its even share of two.
    neighbour_share_ratio: float = 0.5
    neighbour_slowdown_factor: float = 1.5
    neighbour_baseline_s: float = 600.0
    neighbour_hold_s: float = 60.0

    # ---- parallel ---------------------------------------------------------------------
    # In one tensor-parallel group all ranks should be equally busy; a spread of 25
    # points of SM activity (with the busiest above 40 %) marks a straggler.
    imbalance_spread_ratio: float = 0.25
    imbalance_busiest_min_ratio: float = 0.4
    imbalance_hold_s: float = 120.0
    # NVLink 3 and 4 carry 25 GB/s per link and direction; at 80 % of the active links'
    # capacity all-reduce latency starts to grow.
    nvlink_link_bytes_per_second: float = 25e9
    nvlink_saturation_ratio: float = 0.8
    nvlink_hold_s: float = 120.0
    # Tensor parallel without NVLink is a configuration; a minute confirms the group.
    tp_pcie_hold_s: float = 60.0
    # A disaggregated request waits for its KV cache to move from prefill to decode before
    # its first token. Over RDMA or NVLink that is tens of milliseconds; when it is half of
    # the model's median time to first token or more, and that is above 200 ms (an
    # interactive target), the transfer path (a TCP fallback, a NIC far from the GPU)
    # sets TTFT, not compute.
    kv_transfer_ttft_share_min: float = 0.5
    kv_transfer_ttft_min_s: float = 0.2
    kv_transfer_hold_s: float = 120.0

    # ---- decoding ---------------------------------------------------------------------
    # Below half of the drafted tokens accepted, speculative decoding usually costs more
    # (draft and verify passes) than it saves.
    spec_accept_min_ratio: float = 0.5
    spec_hold_s: float = 180.0
    # Inter-token latency p99 five times its median: streams stutter (preemption,
    # prefill interleaving, host stalls) even when the average looks fine.
    itl_jitter_factor: float = 5.0
    itl_hold_s: float = 120.0

    # ---- output -----------------------------------------------------------------------
    # Hold and clear are judged over windows, not on unbroken runs. A condition seen again
    # within 90 s is one episode: a wave every minute, sampled every 10 s, never leaves a
    # longer gap. A finding fires once its episode is its hold time old, the condition
    # holds now and held for at least 15 % of the hold time: a KV cache topping out for
    # 15 s of every minute reads as a quarter, or as a sixth sampled every 10 s, while a
    # stray spike now and then stays far below. One burst shorter than the hold time never
    # fires. A finding clears once the condition held for at most a tenth of its clear
    # time (at least the 90 s of an episode), so one stray sample does not keep a finding
    # that is over, and a storm does not clear between its waves.
    recur_s: float = 90.0
    hold_min_share: float = 0.15
    clear_max_share: float = 0.1
    # Default clear time for rules without their own: a finding stays a minute after its
    # condition went away, so a slowly oscillating signal reads as one episode.
    clear_s: float = 60.0
    # Points per trend chart on the page: 90 over the 15-minute history, 10 s each.
    trend_points: int = 90


DEFAULT = Thresholds()
