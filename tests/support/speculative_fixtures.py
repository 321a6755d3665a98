"""Tiny seeded Llama targets, drafters and training batches for the speculative-decoding tests."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

VOCAB = 384
CHAIN_TOKENS = 256  # the ids the synthetic chains walk over; the rest of the vocabulary is rare


def tiny_llama(seed: int = 0):
    """A random-init 4-layer Llama (hidden 64, vocab 384)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=128,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def successor_table() -> list[int]:
    import torch

    return torch.randperm(CHAIN_TOKENS, generator=torch.Generator().manual_seed(1234)).tolist()


def chain_target(seed: int = 1, sharpness: float = 8.0):
    """A tiny Llama that mostly predicts successor[x] after x (p ~ 0.8 for it): a structured target in no time.

    Its output head is set to read the token embedding back out of the residual stream through a fixed
    permutation, instead of training the target by gradient descent (minutes on a shared CPU).
    """
    import torch

    model = tiny_llama(seed)
    successor = torch.tensor(successor_table())
    with torch.no_grad():
        embed = model.model.embed_tokens.weight
        embed.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(seed))
        head = model.lm_head.weight
        head.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(seed + 1))
        head[successor] = sharpness * embed[:CHAIN_TOKENS] / embed.shape[1]
    return model


def chain_sequences(count: int, length: int, seed: int, jump: float = 0.1) -> list[list[int]]:
    """Walks along the successor permutation, jumping to a random id with probability `jump`."""
    import torch

    successor = successor_table()
    generator = torch.Generator().manual_seed(seed)
    sequences = []
    for _ in range(count):
        token = int(torch.randint(CHAIN_TOKENS, (), generator=generator))
        sequence = [token]
        for _ in range(length - 1):
            if float(torch.rand((), generator=generator)) < jump:
                token = int(torch.randint(CHAIN_TOKENS, (), generator=generator))
            else:
                token = successor[token]
            sequence.append(token)
        sequences.append(sequence)
    return sequences


@contextmanager
def one_torch_thread():
    """Tiny models run fastest on one thread; with busy cores, two spin-wait on each other (10x slower)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module", autouse=True)
def single_threaded_module():
    with one_torch_thread():
        yield


@pytest.fixture(scope="session")
def make_chains():
    """chain_sequences(count, length, seed, jump=0.1), for tests that need fresh chains."""
    return chain_sequences


@pytest.fixture(scope="session")
def random_target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="session")
def target():
    return chain_target()


@pytest.fixture(scope="session")
def chain_data():
    return chain_sequences(count=256, length=64, seed=1)


@pytest.fixture(scope="session")
def random_drafter(target):
    import torch
    from draftsync.speculative.methods.eagle3.model import Eagle3Config, Eagle3Drafter

    torch.manual_seed(5)
    return Eagle3Drafter(Eagle3Config.for_target(target.config)).eval()


def chain_shards_of(target, sequences, directory, masks=None):
    """A hidden-state dataset of `target` over token `sequences` (every token a training target by default)."""
    from draftsync.speculative.data.samples import Sample
    from draftsync.speculative.data.shard_reader import ShardDataset
    from draftsync.speculative.data.shard_writer import build_shards

    samples = [Sample("chain", list(s), list(masks[i]) if masks else [1] * len(s)) for i, s in enumerate(sequences)]
    build_shards(target, samples, directory, (1, 2, 3), shard_tokens=4096, batch_size=32)
    return ShardDataset(directory)


def drifted_chain_target(fraction: float = 0.15):
    """The chain target after a "fine-tune": a share of its successor transitions moved elsewhere."""
    import torch

    model = chain_target()
    successor = torch.tensor(successor_table())
    generator = torch.Generator().manual_seed(99)
    moved = torch.randperm(CHAIN_TOKENS, generator=generator)[: int(fraction * CHAIN_TOKENS)]
    with torch.no_grad():
        head = model.lm_head.weight
        rows = head[successor[moved]].clone()
        head[successor[moved]] = rows[torch.randperm(len(moved), generator=generator)]
    return model


def training_batch_of(target, ids, loss_mask=None, layer_ids=(1, 2, 3), aux=True):
    """A TrainingBatch computed from `target`, as the trainer fills it; `aux=False` leaves out the aux states,
    as a dataset built for drafters that read the final state only does."""
    import torch
    from draftsync.speculative.data.hidden_states import capture
    from draftsync.speculative.data.training_batch import TrainingBatch

    states = capture(target, ids, layer_ids)
    valid = torch.ones_like(ids, dtype=torch.bool)
    mask = valid if loss_mask is None else loss_mask & valid
    return TrainingBatch(
        ids=ids,
        valid=valid,
        loss_mask=mask,
        aux=states.aux.float() if aux else None,
        final=states.final.float(),
        target_logits=states.logits.float(),
    )


@pytest.fixture(scope="session")
def make_training_batch():
    """training_batch_of(target, ids, loss_mask=None, layer_ids=(1, 2, 3), aux=True)."""
    return training_batch_of


def bf16_stored_copy(drafter):
    """A copy of `drafter` whose saved tensors went through bf16, as the checkpoint keeps them."""
    import copy

    import torch

    reference = copy.deepcopy(drafter)
    with torch.no_grad():
        for tensor in reference.state_dict().values():
            if tensor.is_floating_point():
                tensor.copy_(tensor.to(torch.bfloat16))
    return reference


@pytest.fixture(scope="session")
def bf16_stored():
    """bf16_stored_copy(drafter): what a round trip through a checkpoint should give back."""
    return bf16_stored_copy


@pytest.fixture(scope="session")
def make_chain_shards():
    """chain_shards_of(target, sequences, directory, masks=None), for tests that need their own dataset."""
    return chain_shards_of


@pytest.fixture(scope="session")
def drifted_target():
    return drifted_chain_target()


@pytest.fixture(scope="session")
def chain_shards(target, chain_data, tmp_path_factory):
    with one_torch_thread():
        return chain_shards_of(target, chain_data, tmp_path_factory.mktemp("chain-shards"))


@pytest.fixture(scope="session")
def trained(target, chain_shards):
    """(drafter, report) after a short training with a draft vocabulary and two training-time-test steps."""
    from draftsync.speculative.train.config import TrainConfig
    from draftsync.speculative.train.training import fit_drafter

    config = TrainConfig(draft_vocab_size=256, steps=100, batch_size=8, seq_len=32, ttt_steps=2, seed=0)
    with one_torch_thread():
        return fit_drafter(target, chain_shards, config)


@pytest.fixture(scope="session")
def trained_drafter(trained):
    return trained[0]
