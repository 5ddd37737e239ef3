"""The `--profile` summary on a CUDA timeline (`gigatron/training/_profiler.py`), fed with
synthetic profiler events (no GPU here): the loop's `iteration <i>` ranges and other ranges on
the GPU timeline are neither kernel time nor cover the idle gaps between kernels."""

from types import SimpleNamespace

from torch.autograd import DeviceType

from gigatron.training._profiler import summarize


def _event(name, start_us, end_us, annotation=False):
    return SimpleNamespace(
        name=name,
        key=name,
        device_type=DeviceType.CUDA,
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
    prof = SimpleNamespace(events=lambda: events, key_averages=lambda: events)
    text = summarize(prof, iterations=2)
    first = text.splitlines()[0]
    assert first == "profile: CUDA kernel time per iteration 5.00 ms over 2 iterations", first
    assert "GPU idle (no kernel running): 2.50 ms" in text  # (2 + 3) ms over 2 iterations
    assert "3000.0 us  triton_poi_fused_add -> nvjet_sm90_gemm" in text
    assert "iteration 3" not in text and "CompiledFxGraph" not in text
