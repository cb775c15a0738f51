"""Several devices and threads in one process: every op runs on the device of its tensors whatever
device is current, kernels are loaded once per device, two threads driving their own streams (on two
GPUs where there are two) get correct results, and mixed-device arguments raise a typed error."""
import threading

import pytest
import torch

import mla_jit
from mla_jit.errors import InvalidArgumentError
from mla_jit.jit import loader

from .decode_inputs import DecodeCase, make_inputs
from .decode_reference import mla_decode_reference
from .prefill_reference import prefill_reference
from .test_gpu_decode import assert_decode_close

pytestmark = pytest.mark.gpu

two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
CASE = DecodeCase(b=6, s_q=1, s_k=700, h_q=16, varlen=True)


def _decode_on(device: int, seed: int):
    """(inputs, reference) of CASE on `device`, made there without making it current."""
    with torch.cuda.device(device):
        q, k_cache, block_table, lens = make_inputs(CASE, seed=seed)
    ref = mla_decode_reference(q, k_cache, block_table, lens, CASE.dv)
    return (q, k_cache, block_table, lens), ref


def _decode(q, k_cache, block_table, lens):
    metadata, num_splits = mla_jit.get_mla_metadata(lens, CASE.s_q * CASE.h_q, 1)
    return mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, CASE.dv, metadata, num_splits)


def _prefill_on(device: int, seed: int):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    lens = [200, 0, 333]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    q, k = (torch.randn(sum(lens), 16, 192, generator=gen).to(torch.bfloat16) for _ in range(2))
    v = torch.randn(sum(lens), 16, 128, generator=gen).to(torch.bfloat16)
    args = tuple(t.to(f"cuda:{device}") for t in (q, k, v, cu, cu))
    ref = prefill_reference(*args, 192 ** -0.5, True)
    return args, ref


def _check_prefill(out, lse, ref):
    ref_out, ref_lse = ref
    assert (out.float() - ref_out).abs().max().item() <= 2e-2
    finite = ~torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), ~finite)
    assert (lse[finite] - ref_lse[finite]).abs().max().item() <= 2e-3


def _loaded_on(device: int) -> set[tuple[str, str]]:
    return {(key, entry) for (key, entry, dev) in loader._functions if dev == device}


@two_gpus
def test_ops_run_on_their_tensors_device_and_leave_the_current_one():
    torch.cuda.set_device(0)
    decode_args, (ref_out, ref_lse) = _decode_on(1, seed=5)
    out, lse = _decode(*decode_args)
    assert out.device == torch.device("cuda:1") and torch.cuda.current_device() == 0
    torch.cuda.synchronize(1)
    assert_decode_close(out, lse, ref_out, ref_lse)
    decode_kernels = _loaded_on(1)
    assert decode_kernels
    (q, k, v, cu_q, cu_k), ref = _prefill_on(1, seed=6)
    out, lse = mla_jit.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 333, 333, causal=True, return_softmax_lse=True)
    torch.cuda.synchronize(1)
    _check_prefill(out, lse, ref)
    assert torch.cuda.current_device() == 0
    # The same call on device 0: the same binaries (one library each), a function of their own there.
    libraries = set(loader._libraries)
    decode_args0, (ref_out0, ref_lse0) = _decode_on(0, seed=7)
    out0, lse0 = _decode(*decode_args0)
    torch.cuda.synchronize(0)
    assert_decode_close(out0, lse0, ref_out0, ref_lse0)
    assert _loaded_on(0) >= decode_kernels and set(loader._libraries) == libraries
    _decode(*decode_args)
    assert set(loader._libraries) == libraries and _loaded_on(1) >= decode_kernels


@two_gpus
def test_mixed_device_arguments_raise_naming_the_argument():
    (q, k_cache, block_table, lens), _ = _decode_on(0, seed=8)
    metadata, num_splits = mla_jit.get_mla_metadata(lens, CASE.s_q * CASE.h_q, 1)
    with pytest.raises(InvalidArgumentError, match="k_cache"):
        mla_jit.flash_mla_with_kvcache(q, k_cache.to("cuda:1"), block_table, lens, CASE.dv, metadata, num_splits)
    with pytest.raises(InvalidArgumentError, match="cache_seqlens"):
        mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens.to("cuda:1"), CASE.dv, metadata, num_splits)


def test_mixed_host_and_device_arguments_raise_naming_the_argument():
    (q, k_cache, block_table, lens), _ = _decode_on(0, seed=9)
    metadata, num_splits = mla_jit.get_mla_metadata(lens, CASE.s_q * CASE.h_q, 1)
    with pytest.raises(InvalidArgumentError, match="block_table"):
        mla_jit.flash_mla_with_kvcache(q, k_cache, block_table.cpu(), lens, CASE.dv, metadata, num_splits)


def test_two_threads_drive_their_own_streams_at_once():
    """Thread t drives GPU t % device_count (on one GPU both share it) on a stream of its own: 20
    decode and prefill calls each with new inputs, launched concurrently with the other thread's
    (the launch plans, scratch buffers and loaded kernels are shared); every result checked against
    the float32 reference."""
    devices = [t % torch.cuda.device_count() for t in range(2)]
    work = [[(_decode_on(d, seed=100 * t + i), _prefill_on(d, seed=100 * t + i)) for i in range(20)]
            for t, d in enumerate(devices)]
    for d in set(devices):   # warm every kernel on every device first: the threads race on launches
        (decode_args, _), ((q, k, v, cu_q, cu_k), _) = work[devices.index(d)][0]
        _decode(*decode_args)
        mla_jit.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 333, 333, causal=True, return_softmax_lse=True)
    results = [[] for _ in devices]
    errors = []
    start = threading.Barrier(len(devices))

    def drive(t: int) -> None:
        try:
            stream = torch.cuda.Stream(device=devices[t])
            start.wait()
            with torch.cuda.stream(stream):
                for (decode_args, _), ((q, k, v, cu_q, cu_k), _) in work[t]:
                    results[t].append((_decode(*decode_args), mla_jit.flash_attn_varlen_func(
                        q, k, v, cu_q, cu_k, 333, 333, causal=True, return_softmax_lse=True)))
            stream.synchronize()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(t,)) for t in range(len(devices))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not errors, errors
    for t in range(len(devices)):
        assert len(results[t]) == len(work[t])
        for ((out, lse), (p_out, p_lse)), ((_, (ref_out, ref_lse)), (_, p_ref)) in zip(results[t], work[t]):
            assert_decode_close(out, lse, ref_out, ref_lse)
            _check_prefill(p_out, p_lse, p_ref)
