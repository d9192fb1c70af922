"""T(n) and a 1024-token prefill of whichever llama-cpp-python build is importable, on the default model, at 2 threads:
how a build's kernels batch (docs/llamacpp.md). Compare two builds by putting one first on PYTHONPATH:

    python lab/scripts/llamacpp_tn.py                                  # the installed build
    PYTHONPATH=/tmp/other-build python lab/scripts/llamacpp_tn.py      # e.g. pip install --target /tmp/other-build ...
"""
import json

from specframe.target.llamacpp.binding import LlamaModel, build_info
from specframe.target.llamacpp.profile import time_decodes
from specframe.target.models import resolve_model


class T:  # the few members time_decodes reads
    pass
t = T()
t.llama = LlamaModel(resolve_model("smollm2-135m-instruct").gguf)
t.n_ctx, t.vocab_size = 4096, t.llama.n_vocab
out = {"build": build_info().to_dict(), "t_ms_2_threads": time_decodes(t, 2)}
print(json.dumps(out))
import random
import time

from specframe.target.llamacpp.binding import LlamaContext

ctx = LlamaContext(t.llama, 4096, 512, 2)
ids = [random.Random(0).randrange(t.vocab_size) for _ in range(1024)]
t0 = time.perf_counter()
for i in range(0, 1024, 512):
    ctx.decode(ids[i:i + 512], list(range(i, i + 512)), logits="last")
print(json.dumps({"prefill_1024_s": round(time.perf_counter() - t0, 2)}))
