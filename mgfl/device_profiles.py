"""Phone GPUs as a handful of figures, so that a simulation can say how long a step takes on a
phone and how much memory the app may use, without the phone.

Every figure carries its public source. Sources (keys of :data:`SOURCES`) and the marks:

- ``[derived]``: computed from published figures (the computation is given);
- ``[rule]``: a ratio measured on other parts of the same kind, applied here (FACTS section 6:
  sustained FMA ~36-45% of peak; sustained DRAM ~65-70% of the LPDDR peak);
- ``[unverified]``: a figure quoted without a primary source;
- ``[judgement]``: a design target, not a measurement.

Host-device copies: on a phone the GPU shares the LPDDR with the CPU, so an explicit copy reads and
writes every byte once through that memory: ``[derived]`` half the sustained DRAM bandwidth. The one
public measurement of ``clEnqueueWriteBuffer`` on a phone (Mali-T760, 4.7 GB/s) is of that order.
Launch overhead: the only public figure is clpeak's kernel launch latency on a Mali-T760, 1.4 ms; it
is used for every profile and is an upper bound for launches queued back to back in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

GB = 1e9
GFLOPS = 1e9
MIB = 2**20

SOURCES = {
    "azhirnov-adreno6": "github.com/azhirnov/cpu-gpu-arch gpu/Adreno-6xx.md",
    "azhirnov-adreno7": "github.com/azhirnov/cpu-gpu-arch gpu/Adreno-700.md",
    "azhirnov-bifrost": "github.com/azhirnov/cpu-gpu-arch gpu/ARM-Mali-Bifrost.md",
    "azhirnov-valhall": "github.com/azhirnov/cpu-gpu-arch gpu/ARM-Mali-Valhall.md",
    "azhirnov-mobile": "github.com/azhirnov/cpu-gpu-arch gpu/Mobile.md (REAC 2023: 1.4 GB usable "
    "on 2 GB devices)",
    "as-en-adreno660": "github.com/azhirnov/as-en AE/docs/papers/bench-gpu/Adreno_660.md",
    "as-en-g610": "github.com/azhirnov/as-en AE/docs/papers/bench-gpu/ARM_Mali_G610.md",
    "nanoreview": "nanoreview.net SoC comparisons (SD855 vs 765G, SD865 vs 855+)",
    "notebookcheck": "notebookcheck.net Snapdragon 865 / 8 Gen 1 pages",
    "clblast-513": "github.com/CNugteren/CLBlast issue 513 (Adreno 740 SGEMM)",
    "clpeak-t760": "github.com/strin/gemm-android README (clpeak on Mali-T760: write 4.7 GB/s, "
    "kernel launch latency ~1.4 ms)",
    "lpddr": "JEDEC data rates: bytes/s = transfers/s x bus width / 8",
    "facts-rules": "FACTS section 6 rules of thumb: sustained FMA 36-45% of peak "
    "(Adreno 660 728/1622, G610 532/1459); sustained DRAM 65-70% of peak (660 35/51.2)",
}

SUSTAINED_FLOP_RULE = 0.40  # [rule] middle of 36-45% (facts-rules)
SUSTAINED_MEMORY_RULE = 0.68  # [rule] middle of 65-70% (facts-rules)
LAUNCH_OVERHEAD_S = 1.4e-3  # clpeak-t760, used for every profile (see the module docstring)

# Kernel-class efficiencies (mgfl.kernel_classes) measured by client_runtime.calibration on the
# reference device: PoCL 3.1 on 2 shared cores of an AMD EPYC (load ~11), 2026-11-30, by
# `python examples/deploy/cost_model_check.py`. No phone GPU could be measured; these stand in.
REFERENCE_EFFICIENCY: dict[str, float] = {
    "gemm": 0.36, "convolution": 0.53, "pooling": 0.0084, "normalisation": 1.04,
    "elementwise": 3.25, "copy": 0.53,
}


@dataclass(frozen=True)
class DeviceProfile:
    """What the cost model and the simulation need of one phone GPU; rates in SI units."""

    name: str
    soc: str
    peak_flops: float  # float32, 2 per FMA
    sustained_fraction: float  # of peak_flops, for compute-bound kernels
    memory_bandwidth: float  # sustained DRAM bytes/s seen by kernels
    host_copy_bandwidth: float  # host <-> device bytes/s of an explicit copy
    launch_overhead_s: float
    memory_budget_bytes: int  # what the app's training may allocate
    sources: tuple[str, ...]
    notes: str = ""
    # float32 lanes that run at once: a launch of fewer work-items leaves the rest idle (1: every
    # launch fills the device, the plain roofline)
    lanes: int = 1
    # per kernel class (mgfl.kernel_classes): the fraction of the sustained rate and bandwidth
    # that class reaches; a class not listed reaches all of it
    efficiency: Mapping[str, float] = field(default_factory=dict)

    @property
    def sustained_flops(self) -> float:
        return self.peak_flops * self.sustained_fraction

    def class_efficiency(self, kind: str) -> float:
        return self.efficiency.get(kind, 1.0)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "soc": self.soc,
            "peak_gflops": self.peak_flops / GFLOPS,
            "sustained_fraction": self.sustained_fraction,
            "memory_gbps": self.memory_bandwidth / GB,
            "host_copy_gbps": self.host_copy_bandwidth / GB,
            "launch_overhead_ms": self.launch_overhead_s * 1e3,
            "memory_budget_mib": self.memory_budget_bytes / MIB,
            "lanes": self.lanes,
            "efficiency": dict(self.efficiency),
            "sources": [SOURCES[s] for s in self.sources],
            "notes": self.notes,
        }


def _phone(
    name: str,
    soc: str,
    peak_gflops: float,
    dram_peak_gbps: float,
    budget_mib: int,
    sources: tuple[str, ...],
    notes: str,
    lanes: int,
    sustained_fraction: float = SUSTAINED_FLOP_RULE,
    dram_sustained_gbps: float | None = None,
) -> DeviceProfile:
    sustained_bw = dram_sustained_gbps or dram_peak_gbps * SUSTAINED_MEMORY_RULE
    return DeviceProfile(
        name=name,
        soc=soc,
        peak_flops=peak_gflops * GFLOPS,
        sustained_fraction=sustained_fraction,
        memory_bandwidth=sustained_bw * GB,
        host_copy_bandwidth=sustained_bw / 2 * GB,  # [derived] a copy reads and writes the LPDDR
        launch_overhead_s=LAUNCH_OVERHEAD_S,
        memory_budget_bytes=budget_mib * MIB,
        sources=(*sources, "facts-rules", "clpeak-t760"),
        notes=notes,
        lanes=lanes,
        efficiency=REFERENCE_EFFICIENCY,
    )


# Memory budgets [judgement]: FACTS section 6 design target, <= 0.5-1 GB of training working set
# on 4-8 GB phones and <= 300 MB on 2-3 GB phones (azhirnov-mobile), by the RAM that phones with
# each GPU typically ship with.
#
# Peak float32 GFLOPS; DRAM peak GB/s; budget. Sources in brackets (keys of SOURCES).
# - Adreno 620: 384 [derived, unverified: 256 ALU x 2 x 750 MHz, no public figure]; 17
#   [nanoreview]; 512 MiB
# - Adreno 630: 727 [unverified]; 29.9 [unverified]; 512 MiB
# - Adreno 640: 898.5 @585 MHz, 384 ALU [azhirnov-adreno6]; 34.1 [nanoreview], ~30 measured;
#   768 MiB
# - Adreno 650: 1228 @587 MHz, 512 ALU [nanoreview, notebookcheck]; 44 LPDDR5 [nanoreview]; 1 GiB
# - Adreno 660: 1622 @790 MHz, 1024 ALU, 728 measured FMA [as-en-adreno660]; 51.2, 35 measured;
#   1 GiB
# - Adreno 730: ~2000 [derived, rough: 660 + 30% ALUs at 818-900 MHz, notebookcheck]; 51.2; 1 GiB
# - Adreno 740: ~2100 [derived: 1536 lanes x 2 x ~680 MHz, azhirnov-adreno7]; 64 [nanoreview];
#   1 GiB
# - Adreno 750: 3070 @1 GHz [azhirnov-adreno7]; 77 LPDDR5X-9600 [azhirnov-adreno7]; 1 GiB
# - Mali-G76: 404 [derived: MP12 x 48 FLOP/clk x 702 MHz, azhirnov-bifrost]; 34.1 [derived:
#   LPDDR4X-4266 x 64 bit, lpddr]; 384 MiB
# - Mali-G78: 1090 [derived: MP20 x 64 FLOP/clk x 848 MHz, azhirnov-valhall]; 51.2 [derived:
#   LPDDR5-6400 x 64 bit, lpddr]; 768 MiB
# - Mali-G710: 1090 [derived: MP10 x 128 GFLOPS/GHz x 850 MHz, azhirnov-valhall]; 60 [derived:
#   LPDDR5X-7500 x 64 bit, lpddr]; 1 GiB
# - Mali-G610 MC6: 1459 @950 MHz, 532 measured FMA [as-en-g610]; 51.2 [as-en-g610]; 768 MiB
#
# Lanes (float32 lanes at once, what a launch must fill): an FMA lane gives 2 FLOP a clock, so
# lanes = peak / (2 x clock) where the peak and clock are published, else ALUs or FMA/clk/core:
# - Adreno 620: 256 [derived, unverified: the 256 ALUs assumed above]
# - Adreno 630: 512 [derived, unverified: 727 GFLOPS / (2 x 710 MHz)]
# - Adreno 640: 768 [derived: 898.5 GFLOPS / (2 x 585 MHz); azhirnov-adreno6 lists 384 ALUs,
#   so each does two float32 FMAs a clock]
# - Adreno 650: 1024 [derived: 1228 GFLOPS / (2 x 587 MHz) = 1046, 512 ALUs x 2]
# - Adreno 660: 1024 [as-en-adreno660: 1024 ALUs; 1622 / (2 x 790 MHz) = 1027]
# - Adreno 730: 1331 [derived, rough: Adreno 660's 1024 + 30%]
# - Adreno 740: 1536 [azhirnov-adreno7: 1536 float32 lanes]
# - Adreno 750: 1536 [derived: 3070 GFLOPS / (2 x 1 GHz) = 1535]
# - Mali-G76 MP12: 288 [derived: 12 cores x 24 FMA/clk, azhirnov-bifrost]
# - Mali-G78 MP20: 640 [derived: 20 cores x 32 FMA/clk, azhirnov-valhall]
# - Mali-G710 MP10: 640 [derived: 10 cores x 64 FMA/clk, azhirnov-valhall]
# - Mali-G610 MC6: 768 [derived: 1459 GFLOPS / (2 x 950 MHz), as-en-g610]
#
# Class efficiencies cannot be measured without the phone: every phone profile (and the H200's)
# takes REFERENCE_EFFICIENCY, measured on the reference device below. This is the weakest part of
# a phone prediction: a CPU's caches make streaming kernels faster against its DRAM copy bandwidth
# than a phone GPU's would be.
PROFILES: dict[str, DeviceProfile] = {
    p.name: p
    for p in (
        _phone("adreno-620", "Snapdragon 765G", 384, 17, 512, ("nanoreview",),
               "peak [derived, unverified]: no public figure; 256 ALUs x 2 x 750 MHz assumed",
               lanes=256),
        _phone("adreno-630", "Snapdragon 845", 727, 29.9, 512, (),
               "peak and bandwidth [unverified]: quoted without a primary source", lanes=512),
        _phone("adreno-640", "Snapdragon 855", 898.5, 34.1, 768,
               ("azhirnov-adreno6", "nanoreview"), "sustained DRAM measured: a touch below 30 GB/s",
               dram_sustained_gbps=30.0, lanes=768),
        _phone("adreno-650", "Snapdragon 865", 1228, 44, 1024, ("nanoreview", "notebookcheck"), "",
               lanes=1024),
        _phone("adreno-660", "Snapdragon 888", 1622, 51.2, 1024, ("as-en-adreno660",),
               "sustained fraction measured: 728/1622 GFLOPS FMA; DRAM 35 GB/s measured",
               sustained_fraction=728 / 1622, dram_sustained_gbps=35.0, lanes=1024),
        _phone("adreno-730", "Snapdragon 8 Gen 1", 2000, 51.2, 1024,
               ("notebookcheck", "nanoreview"), "peak [derived, rough]: +30% ALUs over Adreno 660",
               lanes=1331),
        _phone("adreno-740", "Snapdragon 8 Gen 2", 2100, 64, 1024,
               ("azhirnov-adreno7", "nanoreview", "clblast-513"),
               "peak [derived]: 1.8 TFLOPS at 600 MHz scaled to ~680 MHz; CLBlast SGEMM "
               "463 GFLOPS", lanes=1536),
        _phone("adreno-750", "Snapdragon 8 Gen 3", 3070, 77, 1024, ("azhirnov-adreno7",), "",
               lanes=1536),
        _phone("mali-g76", "Kirin 980 / Exynos 9820 (MP12)", 404, 34.1, 384,
               ("azhirnov-bifrost", "lpddr"),
               "peak [derived] 12 cores x 48 FLOP/clk x 702 MHz; DRAM [derived] LPDDR4X-4266",
               lanes=288),
        _phone("mali-g78", "Google Tensor (MP20)", 1090, 51.2, 768, ("azhirnov-valhall", "lpddr"),
               "peak [derived] 20 cores x 64 FLOP/clk x 848 MHz; DRAM [derived] LPDDR5-6400",
               lanes=640),
        _phone("mali-g710", "Dimensity 9000 (MP10)", 1090, 60, 1024, ("azhirnov-valhall", "lpddr"),
               "peak [derived] 10 cores x 128 GFLOPS/GHz x 850 MHz; DRAM [derived] LPDDR5X-7500",
               lanes=640),
        _phone("mali-g610", "Dimensity 8200 (MC6)", 1459, 51.2, 768, ("as-en-g610",),
               "sustained fraction measured: 532/1459 GFLOPS FMA", sustained_fraction=532 / 1459,
               lanes=768),
    )
}

# The NVIDIA H200 through its OpenCL driver, for checking the cost model against BENCHMARKS.md:
# ~60 TFLOP/s float32 peak and 4.8 TB/s HBM3e (NVIDIA's H200 product brief); host copies over
# PCIe 5.0 x16 (~64 GB/s peak, [derived] half of it); launch overhead [judgement] 5 us.
H200 = DeviceProfile(
    name="h200", soc="NVIDIA H200 (reference, not a phone)", peak_flops=60e12,
    sustained_fraction=SUSTAINED_FLOP_RULE, memory_bandwidth=4.8e12 * SUSTAINED_MEMORY_RULE,
    host_copy_bandwidth=32 * GB, launch_overhead_s=5e-6, memory_budget_bytes=64 * 2**30,
    sources=("facts-rules",), notes="NVIDIA H200 brief: 60 TFLOPS fp32 (rounded), 4.8 TB/s",
    lanes=132 * 128,  # 132 SMs (the driver's compute units) x 128 float32 lanes (Hopper)
    efficiency=REFERENCE_EFFICIENCY,
)

# The mix `mgfl simulate --devices mix` draws from: each GPU once, so every generation appears.
MIX = tuple(PROFILES)


def get_profile(name: str) -> DeviceProfile:
    """A profile by name (``adreno-650``, ``Adreno 650``, ``mali-g78`` ...), case-insensitive."""
    key = name.strip().lower().replace(" ", "-").replace("_", "-")
    if key == H200.name:
        return H200
    if key not in PROFILES:
        raise ValueError(f"unknown device profile {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[key]
