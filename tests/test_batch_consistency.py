"""``AttentionBatch`` consistency: every new token's slot is the one its sequence's block table
gives its position (or -1), checked by ``check_slot_mapping``, by ``validate_batch``, and by
``Attention.plan`` when ``PLUGIN_API_CHECK_SLOT_MAPPING=1`` or ``PLUGIN_API_STRICT=1``."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import plugin_api as pa
from plugin_api.conformance.cases import make_case
from plugin_api.errors import SettingError
from plugin_api.kv_cache import KVBlockPool, KVCacheManager
from plugin_api.ops.attention import AttentionBatch, check_slot_mapping, validate_batch
from plugin_api.settings import HOST_SETTINGS, Settings, check_names, read_settings

BS = 16
SPEC = pa.AttentionSpec(4, 2, 32, torch.bfloat16, block_size=BS, num_speculative_tokens=2)


def slots_of(table: list[list[int]], query_lens: list[int], seq_lens: list[int]) -> list[int]:
    """The slots of each sequence's new tokens, written out one token at a time."""
    out = []
    for row, q, s in zip(table, query_lens, seq_lens, strict=True):
        out += [row[p // BS] * BS + p % BS for p in range(s - q, s)]
    return out


# sequences 0 and 1 decode (one and three tokens), sequence 2 prefills 20 of its 30 tokens
QUERY_LENS = [1, 3, 20]
SEQ_LENS = [17, 40, 30]
TABLE = [[7, 2, 0], [4, 9, 5], [1, 3, 0]]


def batch_of(**changes: object) -> AttentionBatch:
    fields: dict[str, object] = {
        "query_lens": QUERY_LENS,
        "seq_lens": SEQ_LENS,
        "block_table": TABLE,
        "slot_mapping": slots_of(TABLE, QUERY_LENS, SEQ_LENS),
        "num_decodes": 2,
    }
    fields.update(changes)
    return AttentionBatch.from_lists(**fields)  # type: ignore[arg-type]


def test_a_consistent_batch_passes() -> None:
    batch = batch_of()
    check_slot_mapping(SPEC, batch)
    assert validate_batch(SPEC, batch) == 9


def test_padding_slots_of_minus_one_pass() -> None:
    slots = slots_of(TABLE, QUERY_LENS, SEQ_LENS)
    for t in (0, 2, 10):  # a decode token, a speculative token, a prefill token
        slots[t] = -1
    check_slot_mapping(SPEC, batch_of(slot_mapping=slots))
    check_slot_mapping(SPEC, batch_of(slot_mapping=[-1] * len(slots)))


def test_off_by_one_seq_len_names_the_sequence_and_fields() -> None:
    # sequence 1's slots were made for length 40, the batch says 41: every position moves by one
    seq_lens = [17, 41, 30]
    with pytest.raises(ValueError) as e:
        check_slot_mapping(SPEC, batch_of(seq_lens=seq_lens))
    assert str(e.value) == (
        "attention.plan: batch.slot_mapping[1]=85 for sequence 1 position 38; "
        "batch.block_table[1, 2]=5 and block_size 16 give slot 86 (batch.seq_lens[1]=41 with 3 "
        "query token(s): positions 38..40 are new)"
    )


def test_a_slot_in_another_sequences_block_is_caught() -> None:
    slots = slots_of(TABLE, QUERY_LENS, SEQ_LENS)
    slots[0] = 4 * BS + 3  # sequence 0's token into block 4, which sequence 1 owns
    with pytest.raises(ValueError) as e:
        check_slot_mapping(SPEC, batch_of(slot_mapping=slots))
    assert str(e.value).startswith(
        "attention.plan: batch.slot_mapping[0]=67 for sequence 0 position 16; "
        "batch.block_table[0, 1]=2 and block_size 16 give slot 32"
    )


def test_a_slot_past_the_sequences_blocks_is_caught() -> None:
    slots = slots_of(TABLE, QUERY_LENS, SEQ_LENS)
    t = 23  # sequence 2's last token, position 29, in its block 1 (id 3)
    slots[t] = 12 * BS + 13  # block 12: in no sequence's table
    with pytest.raises(ValueError) as e:
        check_slot_mapping(SPEC, batch_of(slot_mapping=slots))
    assert str(e.value).startswith(
        f"attention.plan: batch.slot_mapping[{t}]=205 for sequence 2 position 29; "
        "batch.block_table[2, 1]=3 and block_size 16 give slot 61"
    )
    # the right block at the wrong offset is no better
    slots[t] = 3 * BS + 12
    with pytest.raises(ValueError, match=r"slot_mapping\[23\]=60 for sequence 2 position 29"):
        check_slot_mapping(SPEC, batch_of(slot_mapping=slots))


def test_strided_block_tables_are_read_by_position() -> None:
    """A column slice of a wider table: the check indexes the table, not its storage."""
    batch = batch_of()
    wide = torch.full((3, 6), 99, dtype=torch.int32)
    wide[:, ::2] = batch.block_table  # columns 0, 2, 4 hold the table
    strided = AttentionBatch(
        batch.query_start_loc, batch.seq_lens, wide[:, ::2], batch.slot_mapping, 2
    )
    assert not strided.block_table.is_contiguous()
    check_slot_mapping(SPEC, strided)
    broken = AttentionBatch(
        batch.query_start_loc, batch.seq_lens, wide[:, 1::2], batch.slot_mapping, 2
    )
    with pytest.raises(ValueError, match=r"block_table\[0, 1\]=99"):
        check_slot_mapping(SPEC, broken)


def test_decode_only_batches_take_the_one_token_per_sequence_path() -> None:
    table = [[3, 8], [5, 1]]
    slots = slots_of(table, [1, 1], [20, 9])
    check_slot_mapping(SPEC, batch_of(query_lens=[1, 1], seq_lens=[20, 9], block_table=table,
                                      slot_mapping=slots))  # fmt: skip
    with pytest.raises(ValueError, match=r"\[1\]=96 for sequence 1 position 8; .*give slot 88"):
        check_slot_mapping(
            SPEC,
            batch_of(query_lens=[1, 1], seq_lens=[20, 9], block_table=table,
                     slot_mapping=[slots[0], slots[1] + 8]),
        )  # fmt: skip


def test_length_checks_come_first_and_slots_below_minus_one_are_wrong() -> None:
    with pytest.raises(ValueError, match=r"batch.seq_lens\[2\]=10 is shorter than its query"):
        check_slot_mapping(SPEC, batch_of(seq_lens=[17, 40, 10]))
    slots = slots_of(TABLE, QUERY_LENS, SEQ_LENS)
    slots[4] = -2  # below -1 is a wrong slot, named like any other
    with pytest.raises(ValueError, match=r"slot_mapping\[4\]=-2 for sequence 2 position 10;"):
        check_slot_mapping(SPEC, batch_of(slot_mapping=slots))


def test_validate_batch_can_leave_the_slots_unchecked() -> None:
    slots = slots_of(TABLE, QUERY_LENS, SEQ_LENS)
    slots[0] = 4 * BS + 3
    batch = batch_of(slot_mapping=slots)
    assert validate_batch(SPEC, batch, check_slots=False) == 9
    with pytest.raises(ValueError, match="for sequence 0 position 16"):
        validate_batch(SPEC, batch)


def test_context_parallel_specs_are_not_checked() -> None:
    """With dcp_size > 1 a rank keeps part of each sequence, with its own slot layout."""
    spec = pa.AttentionSpec(4, 2, 32, torch.bfloat16, block_size=BS, dcp_size=2,
                            num_speculative_tokens=2)  # fmt: skip
    slots = slots_of(TABLE, QUERY_LENS, SEQ_LENS)
    slots[0] = 4 * BS + 3
    check_slot_mapping(spec, batch_of(slot_mapping=slots))


# ---- random batches against a token-by-token oracle ----------------------------------------------


@st.composite
def random_batches(draw: st.DrawFn) -> tuple[list[int], list[int], list[list[int]], int]:
    n = draw(st.integers(1, 6))
    decodes = draw(st.integers(0, n))
    qlens = [draw(st.integers(1, 3)) for _ in range(decodes)]
    qlens += [draw(st.integers(1, 40)) for _ in range(n - decodes)]
    slens = [q + draw(st.integers(0, 50)) for q in qlens]
    width = max(-(-s // BS) for s in slens) + draw(st.integers(0, 2))
    ids = draw(st.permutations(range(n * width)))
    table = [list(ids[i * width : (i + 1) * width]) for i in range(n)]
    return qlens, slens, table, decodes


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_batches(), st.data())
def test_random_batches_pass_and_one_wrong_slot_is_named(
    drawn: tuple[list[int], list[int], list[list[int]], int], data: st.DataObject
) -> None:
    qlens, slens, table, decodes = drawn
    slots = slots_of(table, qlens, slens)
    pads = data.draw(st.sets(st.integers(0, len(slots) - 1), max_size=3))
    for t in pads:
        slots[t] = -1

    def batch(slots: list[int]) -> AttentionBatch:
        return AttentionBatch.from_lists(
            query_lens=qlens, seq_lens=slens, block_table=table, slot_mapping=slots,
            num_decodes=decodes,
        )  # fmt: skip

    check_slot_mapping(SPEC, batch(slots))
    t = data.draw(st.integers(0, len(slots) - 1))
    wrong = data.draw(st.integers(0, len(table) * len(table[0]) * BS - 1))
    owner = next(i for i in range(len(qlens)) if sum(qlens[: i + 1]) > t)
    position = slens[owner] - (sum(qlens[: owner + 1]) - t)
    right = table[owner][position // BS] * BS + position % BS
    if wrong == right:
        return
    slots[t] = wrong
    with pytest.raises(ValueError) as e:
        check_slot_mapping(SPEC, batch(slots))
    # every other token is right or -1, so the error names t
    assert re.search(
        rf"batch\.slot_mapping\[{t}\]={wrong} for sequence {owner} position {position}; "
        rf"batch\.block_table\[{owner}, {position // BS}\]={table[owner][position // BS]} "
        rf"and block_size {BS} give slot {right} ",
        str(e.value),
    ), str(e.value)


# ---- batches the project builds pass -------------------------------------------------------------


def test_conformance_cases_pass() -> None:
    for skip in ((), (0, 2)):
        case = make_case(SPEC, [1, 3, 9], [30, 19, 9], num_decodes=2, device="cpu", seed=3,
                         skip_tokens=skip, pad_rows=2)  # fmt: skip
        check_slot_mapping(SPEC, case.batch)


def test_kv_cache_manager_steps_pass() -> None:
    spec = pa.AttentionSpec(4, 2, 32, torch.bfloat16, block_size=4, num_speculative_tokens=1)
    m = KVCacheManager(KVBlockPool(64), block_size=4, num_speculative_tokens=1)
    for s in ("a", "b"):
        m.add_sequence(s)
    check_slot_mapping(spec, m.schedule({"a": 10, "b": 3}).attention_batch(pad_to=16))
    m.fork("a", "c")  # shares a's partly filled last block: the first write copies it
    for i in range(9):  # decodes and speculative decodes crossing block boundaries
        step = m.schedule({"a": 1, "b": 1 + i % 2, "c": 2})
        check_slot_mapping(spec, step.attention_batch())


# ---- when Attention.plan runs it -----------------------------------------------------------------


def test_the_setting_parses_and_is_a_known_name() -> None:
    assert "PLUGIN_API_CHECK_SLOT_MAPPING" in HOST_SETTINGS
    assert not read_settings({}).check_slot_mapping
    assert read_settings({"PLUGIN_API_CHECK_SLOT_MAPPING": "1"}).check_slot_mapping
    assert not read_settings({"PLUGIN_API_CHECK_SLOT_MAPPING": "0"}).check_slot_mapping
    with pytest.raises(SettingError, match="PLUGIN_API_CHECK_SLOT_MAPPING='maybe' is not a"):
        read_settings({"PLUGIN_API_CHECK_SLOT_MAPPING": "maybe"})
    check_names({"PLUGIN_API_CHECK_SLOT_MAPPING": "1"}, ())


def _inconsistent() -> AttentionBatch:
    slots = slots_of(TABLE, QUERY_LENS, SEQ_LENS)
    slots[0] = 4 * BS + 3
    return batch_of(slot_mapping=slots)


@pytest.mark.parametrize(
    ("settings_", "checked"),
    [
        (Settings(), False),
        (Settings(check_slot_mapping=True), True),
        (Settings(strict=True), True),
    ],
)
def test_plan_checks_when_asked_or_strict(settings_: Settings, checked: bool) -> None:
    attn = pa.attention(SPEC, pa.backend_for("reference", settings=settings_))
    assert attn.checks_slot_mapping is checked
    attn.plan(batch_of())
    if checked:
        with pytest.raises(ValueError, match="for sequence 0 position 16"):
            attn.plan(_inconsistent())
    else:
        attn.plan(_inconsistent())


def test_the_environment_reaches_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLUGIN_API_CHECK_SLOT_MAPPING", "1")
    attn = pa.attention(SPEC, pa.backend_for("reference"))
    with pytest.raises(ValueError, match="for sequence 0 position 16"):
        attn.plan(_inconsistent())
