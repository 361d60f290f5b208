"""Issue 31's fuzz: one ``LLM`` takes a long random sequence of calls, valid and invalid.

Each run draws, from a fixed fuzz seed (``FUZZ_SEED`` in the environment picks another), calls to
``generate`` (prompts as text, ids or vLLM's prompt dicts; greedy, seeded and unseeded sampling,
stop strings and ids, ``min_tokens``, ``logprobs``, ``n > 1``), some stopped by Ctrl-C (a
``KeyboardInterrupt`` from ``on_step``) or by a step whose forward pass raises (on every rank),
``add_request``/``step``/``abort_request`` sessions, and invalid requests. Small KV pools force
preemption; variants add swapping, the offload tier, n-gram and draft-model speculation, and two
tensor-parallel ranks.

Checked after every call: an invalid request raised ``ValueError`` and queued nothing; no request
is left in flight and every block is back in the pool; every greedy output, and without
speculation every seeded one, equals the one a reference engine (same model and speculation,
roomy cache) gives the request alone. (Under speculation a seeded sample also depends on how many
drafts each step verified, which the batch's token budget and the request's room decide: the
rejection sampler then draws other random numbers.) A failure names the fuzz seed, the variant
and the calls so far.
"""

import collections
import contextlib
import dataclasses
import math
import os
import random
import string

import pytest
import torch

from course_lib.engine.llm import LLM
from course_lib.engine.sampling_params import SamplingParams

FUZZ_SEED = int(os.environ.get("FUZZ_SEED", "31"))
ALPHABET = "\0\1" + string.ascii_lowercase + string.ascii_uppercase + string.digits  # the tiny model's 64 ids
BLOCK_SIZE, MAX_MODEL_LEN = 4, 40
TIGHT = dict(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE,
             dtype=torch.float64)  # the model's own: a draft model object is moved to this dtype in place


def every_rank_fails(worker, batch):
    """A step's forward pass that fails the same way on every tensor-parallel rank."""
    raise RuntimeError("this step fails")


class SmallTokenizer:
    """One character per id of the tiny model's vocabulary (0 and 1, BOS and EOS, are special)."""

    def encode(self, text: str) -> list[int]:
        return [ALPHABET.index(c) for c in text]

    def decode(self, token_ids, skip_special_tokens: bool = True) -> str:
        return "".join(ALPHABET[t] for t in token_ids if t > 1 or not skip_special_tokens)


def short(params: SamplingParams) -> str:
    """``params`` by its fields that differ from the defaults, for the failure log."""
    changed = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)
               if getattr(params, f.name) != getattr(SamplingParams(), f.name)}
    return f"SamplingParams({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


class Fuzzer:
    """Draws calls for one engine and checks each against a reference engine's outputs."""

    def __init__(self, llm: LLM, reference: LLM, rng: random.Random, label: str) -> None:
        self.llm, self.reference, self.rng, self.label = llm, reference, rng, label
        self.seeded_reproducible = llm.speculative_config is None
        self.log: list[str] = []
        self.tally = collections.Counter()  # what the run exercised: interrupts, refusals, compared outputs
        self.expected: dict = {}  # (prompt ids, params) -> the reference's completions
        self.prefixes = [[rng.randrange(2, 64) for _ in range(rng.randrange(4, 10))] for _ in range(3)]

    # --- drawing valid input ----------------------------------------------------------
    def prompt_ids(self) -> list[int]:
        """Often a shared prefix plus a short tail: prefix-cache hits, offloads and reloads happen."""
        tail = [self.rng.randrange(2, 64) for _ in range(self.rng.randrange(1, 6))]
        return (self.rng.choice(self.prefixes) if self.rng.random() < 0.6 else []) + tail

    def prompt(self):
        """A prompt in one of the four forms ``generate`` takes, and its ids."""
        ids = self.prompt_ids()
        text = SmallTokenizer().decode(ids)
        form = self.rng.choice([text, ids, {"prompt": text}, {"prompt_token_ids": ids}])
        return form, ids

    def params(self, seeded: bool | None = None) -> SamplingParams:
        rng = self.rng
        seeded = rng.random() < 0.4 if seeded is None else seeded
        max_tokens = rng.randrange(1, 13)
        options = dict(max_tokens=max_tokens, ignore_eos=rng.random() < 0.5,
                       n=rng.choice([1, 1, 1, 2, 3]), min_tokens=rng.randrange(0, max_tokens + 1))
        if seeded:
            options.update(temperature=rng.choice([0.7, 1.0, 1.5]), seed=rng.randrange(1000),
                           top_k=rng.choice([0, 0, 5]), top_p=rng.choice([1.0, 1.0, 0.9]))
        else:
            options.update(temperature=0)
        if rng.random() < 0.3:
            options["stop_token_ids"] = [rng.randrange(2, 64) for _ in range(rng.randrange(1, 3))]
        if rng.random() < 0.3:
            options["stop"] = ["".join(rng.choice(ALPHABET[2:]) for _ in range(rng.randrange(1, 3)))]
            options["include_stop_str_in_output"] = rng.random() < 0.5
        if rng.random() < 0.3:
            options["logprobs"] = rng.choice([0, 1, 3])
        return SamplingParams(**options)

    def comparable(self, params: SamplingParams) -> bool:
        return params.greedy or (params.seed is not None and self.seeded_reproducible)

    def expect(self, ids: list[int], params: SamplingParams) -> list:
        """The reference engine's completions of this request, run alone (computed once)."""
        key = (tuple(ids), params)
        if key not in self.expected:
            self.expected[key] = self.reference.generate([ids], params, use_tqdm=False)[0].outputs
        return self.expected[key]

    # --- the checks ------------------------------------------------------------------
    def assert_idle(self) -> None:
        """No request left in flight, every block back in the pool (and, now and then, the prefix
        cache emptied: ``reset_prefix_cache`` succeeds only when nothing holds a block)."""
        llm, pool = self.llm, self.llm.kv_cache_manager.block_pool
        assert not llm.scheduler.requests and not llm.scheduler.has_unfinished_requests()
        assert not llm.scheduler.swapped and not llm._generators and not llm._siblings
        assert pool.num_free_blocks == pool.num_blocks
        if getattr(llm.proposer, "rows", None) is not None:
            assert not llm.proposer.rows
        if self.rng.random() < 0.2:
            assert llm.reset_prefix_cache()

    def assert_matches(self, got, ids: list[int], params: SamplingParams) -> None:
        """Comparable completions equal the reference's; others only keep their limits."""
        if not self.comparable(params):
            assert all(len(c.token_ids) <= params.max_tokens for c in got)
            return
        self.tally["compared"] += 1
        want = self.expect(ids, params)
        assert [c.token_ids for c in got] == [c.token_ids for c in want]
        assert [(c.text, c.finish_reason, c.stop_reason) for c in got] == \
               [(c.text, c.finish_reason, c.stop_reason) for c in want]
        for mine, theirs in zip(got, want):
            if theirs.logprobs is not None:
                assert [sorted(step) for step in mine.logprobs] == [sorted(step) for step in theirs.logprobs]
                assert all(math.isclose(step[t].logprob, other[t].logprob, rel_tol=1e-6, abs_tol=1e-9)
                           for step, other in zip(mine.logprobs, theirs.logprobs) for t in step)

    # --- the calls ---------------------------------------------------------------------
    @contextlib.contextmanager
    def failing_step(self, step: int | None):
        """The ``step``-th forward pass from now raises (on the ranks, at tensor_parallel_size > 1)."""
        runner, calls = self.llm.runner, []
        if step is None:
            yield
            return
        pool = getattr(runner, "pool", None)
        owner, name = (pool, "call") if pool is not None else (runner, "execute")
        real = getattr(owner, name)

        def failing(*args, **kwargs):
            calls.append(1)
            if len(calls) != step:
                return real(*args, **kwargs)
            if pool is None:
                raise RuntimeError("this step fails")
            return real(every_rank_fails, *args[1:], **kwargs)

        setattr(owner, name, failing)
        try:
            yield
        finally:
            delattr(owner, name)  # the instance attribute goes; the method shows again

    def generate(self, ending: str | None, within: int) -> None:
        """``ending``: None (run to the end), "interrupt" (Ctrl-C after step ``within`` from now) or
        "fail" (the forward pass ``within`` from now raises)."""
        count = self.rng.randrange(1, 5)
        drawn = [self.prompt() for _ in range(count)]
        params = [self.params() for _ in range(count)]
        one_params = self.rng.random() < 0.3
        if one_params:
            params = [params[0]] * count
        stop_at = len(self.llm.step_trace) + within if ending == "interrupt" else None
        fail_at = within if ending == "fail" else None

        def on_step(step):
            if step == stop_at:
                raise KeyboardInterrupt

        prompts = [form for form, _ in drawn]
        single = count == 1 and self.rng.random() < 0.5
        self.log.append(f"generate({prompts!r}, [{', '.join(map(short, params))}], interrupt at step {stop_at}, "
                        f"forward pass {fail_at} from now fails)")
        try:
            with self.failing_step(fail_at):
                outputs = self.llm.generate(prompts[0] if single else prompts, params[0] if one_params else params,
                                            on_step=on_step, use_tqdm=False)
        except KeyboardInterrupt:
            self.tally["interrupted"] += 1
            return
        except RuntimeError as error:
            assert fail_at is not None and "this step fails" in str(error), error
            self.tally["failed"] += 1
            return
        assert len(outputs) == count
        for output, (_, ids), one in zip(outputs, drawn, params):
            assert output.prompt_token_ids == ids
            self.assert_matches(output.outputs, ids, one)

    def session(self) -> None:
        """``add_request`` some requests, ``step`` them (aborting some, and trying to reuse an id
        in flight), until none is left; the survivors' tokens equal the reference's."""
        llm, added = self.llm, {}
        for _ in range(self.rng.randrange(1, 4)):
            _, ids = self.prompt()
            params = self.params()
            # ids of our own, one name space per n == 1 or n > 1 (a parent id is never a single request's)
            request_id = f"{'s' if params.n == 1 else 'm'}{self.rng.randrange(3)}" if self.rng.random() < 0.6 else None
            if request_id in added:  # all adds come before any step: it is still in flight
                self.log.append(f"add_request({ids}, {short(params)}, request_id={request_id!r}) while in flight")
                self.refused(lambda: llm.add_request(ids, params, request_id=request_id))
                continue
            self.log.append(f"add_request({ids}, {short(params)}, request_id={request_id!r})")
            children = llm.add_request(ids, params, request_id=request_id)
            added[children[0] if params.n == 1 else children[0].rpartition(".")[0]] = (ids, params)
        finished, aborted = {}, set()
        while llm.scheduler.has_unfinished_requests():
            if self.rng.random() < 0.1:
                victim = self.rng.choice(sorted(added))
                self.log.append(f"abort_request({victim!r})")
                llm.abort_request(victim)
                aborted.add(victim)
                self.tally["aborted"] += 1
            self.log.append("step()")
            for request in llm.step():
                finished[request.request_id] = request.output_token_ids
        for base, (ids, params) in added.items():
            if base in aborted or not self.comparable(params):
                continue
            self.tally["compared"] += 1
            want = self.expect(ids, params)
            got = [finished[base]] if params.n == 1 else [finished[f"{base}.{i}"] for i in range(params.n)]
            assert got == [c.token_ids for c in want], base

    def refused(self, call) -> None:
        """``call`` raises ValueError and changes nothing: no request queued, no block taken, no step run."""
        llm, pool = self.llm, self.llm.kv_cache_manager.block_pool
        before = (sorted(llm.scheduler.requests), pool.num_free_blocks, len(llm.step_trace))
        with pytest.raises(ValueError):
            call()
        self.tally["refused"] += 1
        assert (sorted(llm.scheduler.requests), pool.num_free_blocks, len(llm.step_trace)) == before

    def invalid(self) -> None:
        rng, llm = self.rng, self.llm
        _, good = self.prompt()
        params = self.params()
        bad_params = rng.choice([
            dict(temperature=math.nan), dict(temperature=-1.0), dict(top_p=0.0), dict(top_k=2.5),
            dict(top_k=-3), dict(n=0), dict(max_tokens=0), dict(min_tokens=5, max_tokens=2),
            dict(logprobs=-2), dict(seed=1.5), dict(stop=[""]), dict(stop_token_ids=[-1]),
        ])
        cases = {
            "prompt ids outside the vocabulary": lambda: llm.generate([good, [3, 64]], params),
            "a negative prompt id": lambda: llm.add_request([5, -1, 6], params),
            "a non-integer prompt id": lambda: llm.generate([[5, 2.5]], params),
            "an empty prompt": lambda: llm.generate([good, []], params),
            "a prompt longer than max_model_len": lambda: llm.generate([[5] * (MAX_MODEL_LEN + 1)], params),
            "stop ids outside the vocabulary": lambda: llm.generate(
                [good], SamplingParams(temperature=0, stop_token_ids=[3, 64 + rng.randrange(100)])),
            "logprobs over max_logprobs": lambda: llm.add_request(good, SamplingParams(logprobs=-1)),
            "a prompt dict with another key": lambda: llm.generate([{"prompt_token_ids": good, "lora": 1}]),
            "sampling params for the wrong number of prompts": lambda: llm.generate([good, good], [params] * 3),
            "priority without priority scheduling": lambda: llm.add_request(good, params, priority=1),
            f"SamplingParams(**{bad_params})": lambda: llm.generate([good], SamplingParams(**bad_params)),
        }
        name = rng.choice(sorted(cases))
        self.log.append(f"invalid: {name}")
        self.refused(cases[name])

    def run(self, calls: int) -> None:
        try:
            for call in range(calls):
                # each kind once at the start (an ending at the first step always happens), then at random
                kind = KINDS[call] if call < len(KINDS) else self.rng.choices(KINDS, weights=(30, 8, 7, 25, 30))[0]
                if kind.startswith("generate"):
                    ending = kind.partition(" ")[2] or None
                    self.generate(ending, 1 if call < len(KINDS) else self.rng.randrange(1, 6))
                elif kind == "session":
                    self.session()
                else:
                    self.invalid()
                self.assert_idle()
        except BaseException as error:
            raise AssertionError(f"fuzz seed {FUZZ_SEED}, variant {self.label}: failed at call {len(self.log)}; "
                                 "the calls so far:\n" + "\n".join(self.log[-40:])) from error


KINDS = ("generate", "generate interrupt", "generate fail", "session", "invalid")
VARIANTS = {  # name: (the engine's options, calls)
    "recompute": (dict(num_gpu_blocks=10), 90),
    "swap": (dict(num_gpu_blocks=10, preemption_mode="swap"), 50),
    "offload": (dict(num_gpu_blocks=10, kv_offload_blocks=6), 50),
    "ngram": (dict(num_gpu_blocks=10, speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                                          "prompt_lookup_max": 2}), 40),
    "draft_model": (dict(num_gpu_blocks=10, speculative_config="draft"), 40),
    "tensor_parallel": (dict(num_gpu_blocks=10, tensor_parallel_size=2), 30),
}


@pytest.fixture(scope="module")
def references(tiny_model):
    """Reference engines with a roomy cache, one per kind of speculation (each request runs alone)."""
    made = {}

    def reference(spec: dict | None) -> LLM:
        method = spec and spec["method"]
        if method not in made:
            made[method] = LLM(tiny_model, tokenizer=SmallTokenizer(), speculative_config=spec, **TIGHT)
        return made[method]

    return reference


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_random_calls_leave_the_engine_correct(tiny_model, references, variant):
    options, calls = VARIANTS[variant]
    options = dict(options)
    if options.get("speculative_config") == "draft":  # the model drafts for itself: every draft is accepted
        options["speculative_config"] = {"method": "draft_model", "model": tiny_model, "num_speculative_tokens": 2}
    reference = references(options.get("speculative_config"))
    with LLM(tiny_model, tokenizer=SmallTokenizer(), **TIGHT, **options) as llm:
        fuzzer = Fuzzer(llm, reference, random.Random(f"{FUZZ_SEED}-{variant}"), variant)
        fuzzer.run(calls)
    # the run did exercise what it is meant to, not just easy paths (another FUZZ_SEED may need more calls)
    assert min(fuzzer.tally[k] for k in ("interrupted", "failed", "refused", "aborted", "compared")) > 0, fuzzer.tally
    assert llm.scheduler.total_preemptions > 0
    if "kv_offload_blocks" in options:
        assert llm.kv_cache_manager.prefix_cache_stats.cpu_hit_tokens > 0
    if "speculative_config" in options:
        assert llm.spec_decode_stats.num_accepted_tokens > 0
