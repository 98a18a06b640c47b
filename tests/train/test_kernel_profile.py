"""The kernel summary of a profiler trace: device rows only, per step, by category."""

import pytest

from jaxtrain.train.step_trace import category, summarize_trace


def _trace():
    meta = [
        {'ph': 'M', 'pid': 1, 'name': 'process_name', 'args': {'name': '/host:CPU'}},
        {'ph': 'M', 'pid': 7, 'name': 'process_name', 'args': {'name': '/device:GPU:0'}},
    ]
    kernels = [
        ('nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT', 3000.0),
        ('nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT', 1000.0),
        ('cudnn_generated_fort_native_sdpa_sm90_flash_bprop', 2000.0),
        ('loop_convert_multiply_fusion_11', 500.0),
        ('memcpy128', 250.0),
        ('mystery_kernel', 250.0),
    ]
    device = [
        {'ph': 'X', 'pid': 7, 'tid': 3, 'ts': i, 'dur': dur, 'name': n} for i, (n, dur) in enumerate(kernels)
    ]
    host = [{'ph': 'X', 'pid': 1, 'tid': 9, 'ts': 0, 'dur': 99_000.0, 'name': 'PjitFunction(train_step)'}]
    return {'traceEvents': meta + device + host}


def test_device_rows_are_summed_per_kernel_and_step():
    summary = summarize_trace(_trace(), steps=2)
    # 7000 us of device kernels over 2 steps; the host's 99 ms row is not a kernel.
    assert summary.total_ms == pytest.approx(3.5)
    assert summary.ms_per_step['nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT'] == pytest.approx(2.0)
    assert summary.calls_per_step['nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT'] == 1.0
    assert summary.by_category() == pytest.approx(
        {'matmul': 2.0, 'attention': 1.0, 'fusion': 0.25, 'copy': 0.125, 'other': 0.125}
    )
    lines = summary.lines(top=2)
    assert lines[0].startswith('kernels     3.50 ms per step') and len(lines) == 3
    assert 'nvjet' in lines[1] and 'cudnn' in lines[2]


def test_no_device_rows_says_so():
    trace = _trace()
    trace['traceEvents'] = [e for e in trace['traceEvents'] if e.get('pid') != 7]
    summary = summarize_trace(trace, steps=1)
    assert summary.total_ms == 0 and 'none on a device' in summary.lines()[0]


@pytest.mark.parametrize(
    'name,expected',
    [
        ('mha_backward', 'attention'),
        ('gemm_fusion_dot_99', 'matmul'),
        ('input_add_reduce_fusion_21', 'fusion'),
        ('wrapped_concatenate', 'fusion'),
        ('Memset 0', 'copy'),
        ('softmax_cross_entropy', 'loss'),
    ],
)
def test_categories(name, expected):
    assert category(name) == expected
