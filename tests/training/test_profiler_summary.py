"""The `--profile` summary on a CUDA timeline (`gigatron/training/_profiler.py`), fed with
synthetic profiler events (no GPU here): the loop's `iteration <i>` ranges and other ranges on
the GPU timeline are neither kernel time nor cover the idle gaps between kernels."""

from types import SimpleNamespace

from torch.autograd import DeviceType

from gigatron.training._profiler import summarize


def _event(name, start_us, end_us, annotation=False, device=DeviceType.CUDA):
    return SimpleNamespace(
        name=name,
        key=name,
        device_type=device,
        is_user_annotation=annotation,
        time_range=SimpleNamespace(start=start_us, end=end_us),
        self_device_time_total=end_us - start_us,
        count=1,
    )


def test_iteration_ranges_are_not_kernels_and_do_not_hide_gaps():
    events = [
        _event("iteration 32", 0, 10_000, annotation=True),
        _event("## Call CompiledFxGraph abc ##", 0, 4_000),  # a range named without the flag
        _event("iteration 33", 10_000, 20_000),  # the loop's range, even without the flag
        _event("nvjet_sm90_gemm", 0, 4_000),
        _event("triton_poi_fused_add", 6_000, 7_000),  # 2 ms idle before it
        _event("nvjet_sm90_gemm", 10_000, 14_000),  # 3 ms idle before it
        _event("cudnn_sdpa_fprop", 14_000, 15_000),
    ]
    cpu = DeviceType.CPU
    host = [
        _event("iteration 33", 9_000, 30_000, device=cpu),  # 7x the gap: kept, little overlap
        _event("ProfilerStep", 0, 100_000, device=cpu),  # far longer than the gap: left out
        _event("aten::copy_", 6_900, 9_500, device=cpu),  # 2.5 ms of the 3 ms gap
        _event("cudaHostAlloc", 7_500, 9_400, device=cpu),
    ]
    prof = SimpleNamespace(events=lambda: events + host, key_averages=lambda: events + host)
    text = summarize(prof, iterations=2)
    first = text.splitlines()[0]
    assert first == "profile: CUDA kernel time per iteration 5.00 ms over 2 iterations", first
    assert "GPU idle (no kernel running): 2.50 ms" in text  # (2 + 3) ms over 2 iterations
    assert "3000.0 us  triton_poi_fused_add -> nvjet_sm90_gemm" in text
    assert "host meanwhile (us): aten::copy_ 2500, cudaHostAlloc 1900, iteration 33 1000" in text
    assert "ProfilerStep" not in text and "CompiledFxGraph" not in text
    assert "iteration 32" not in text


def test_identical_gaps_get_their_own_host_line():
    """Rows that print the same (size, kernels) are still told apart: the host line follows the
    gap it belongs to and no other."""
    events = []
    for i in range(3):  # three 1 ms gaps between the same two kernels
        t = i * 10_000
        events += [_event("gemm", t, t + 4_000), _event("add", t + 5_000, t + 6_000)]
    host = [_event("aten::copy_", 14_200, 14_800, device=DeviceType.CPU)]  # in the 2nd gap only
    prof = SimpleNamespace(events=lambda: events + host, key_averages=lambda: events + host)
    text = summarize(prof, iterations=1)
    assert text.count("host meanwhile") == 1, text
