"""A training run for the torch resume test (run as a script): a tiny GPT-like model trained on
a Loader's batches through two DataLoader workers, logging each step's batch digest and loss.

``python torch_resume_child.py JOB`` with JOB a JSON dict: ``data`` (a token store), ``pattern``
(``torch_loader``: ``loader.torch_loader(num_workers=2)`` and ``loader.state_dict()``;
``stateful``: torchdata's ``StatefulDataLoader(loader.to_torch(), ...)`` and its
``state_dict()``; ``plain``: ``DataLoader(loader.to_torch(), ...)`` and
``loader.state_dict()``), ``steps``, ``log`` (a file the steps are appended to), ``ckpt``,
``kill_at`` (after that many steps: save the checkpoint, then SIGKILL this process) and
``resume`` (start from the checkpoint).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys

import torch
from torch import nn
from torch.nn import functional as F

import lmdata
from lmdata.errors import InvalidInputError

VOCAB, SEQ, DIM = 64, 16, 16


class TinyGPT(nn.Module):
    """One causal self-attention block and an MLP, tied embeddings: about 4k parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(SEQ, DIM)
        self.ln1, self.ln2, self.ln3 = nn.LayerNorm(DIM), nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        x = self.tok(ids) + self.pos(torch.arange(t))
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, 2, DIM // 2).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, DIM))
        x = x + self.mlp(self.ln2(x))
        return self.ln3(x) @ self.tok.weight.T


def digest(batch: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for key in sorted(batch):
        h.update(key.encode())
        h.update(batch[key].numpy().tobytes())
    return h.hexdigest()[:16]


def main(job: dict) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = lmdata.Loader(
        job["data"], seq_len=SEQ, global_batch_size=4, seed=3, rank=0, world_size=1
    )
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    start, ck = 0, None
    if job.get("resume"):
        ck = torch.load(job["ckpt"], weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        start = ck["step"]
    pattern = job["pattern"]
    if pattern == "torch_loader":
        if ck is not None:
            loader.load_state_dict(ck["data"])
        batches = loader.torch_loader(num_workers=2)
        data_state = loader.state_dict
    elif pattern == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        batches = StatefulDataLoader(loader.to_torch(), batch_size=None, num_workers=2)
        if ck is not None:
            batches.load_state_dict(ck["data"])
        data_state = batches.state_dict
    else:  # the plain pattern: the loader's own state (refused with workers)
        batches = torch.utils.data.DataLoader(loader.to_torch(), batch_size=None, num_workers=2)
        data_state = loader.state_dict
    with open(job["log"], "a") as log:
        for step, batch in zip(range(start, job["steps"]), batches, strict=False):
            logits = model(batch["inputs"].long())
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch["targets"].long().reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            line = {"step": step, "batch": digest(batch), "loss": loss.item().hex()}
            log.write(json.dumps(line) + "\n")
            log.flush()
            if pattern != "stateful":
                assert "torchdata" not in sys.modules  # lmdata never imports it
            if step + 1 == job.get("kill_at"):
                try:
                    data = data_state()
                except InvalidInputError as e:
                    print(f"REFUSED: {e}", flush=True)
                    sys.exit(3)
                ck = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}
                torch.save({**ck, "data": data}, job["ckpt"] + ".tmp")
                os.replace(job["ckpt"] + ".tmp", job["ckpt"])
                os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
