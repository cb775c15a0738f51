import sys, torch, mla_jit
sys.path.insert(0, "tests")
from sparse_inputs import SparseCase, make_sparse_inputs
b, s_q, h_q = (int(x) for x in sys.argv[1:4])
case = SparseCase(b, s_q, h_q, 2048, s_k=32768, invalid=0.0)
q, records, _, indices, _, _ = make_sparse_inputs(case)
sched, _ = mla_jit.get_mla_metadata()
for _ in range(3):
    mla_jit.flash_mla_with_kvcache(q, records, None, None, 512, sched, None, is_fp8_kvcache=True, indices=indices)
torch.cuda.synchronize()
