"""PII scrubbing: a positive and a near-miss fixture for every kind, bounded patterns, adversarial inputs."""

import re._constants as sre_constants
import re._parser as sre_parser

import pytest

from rubric_jax.prepare import pii

# (kind under test, text, scrubbed text, replacement counts). Near misses name what makes them miss.
POSITIVES = [
    ("email", "Write to lily.chen+shop@example.co.uk today", "Write to [EMAIL] today", {"email": 1}),
    ("email", "发票请发到邮箱 wang.lei@example.cn，谢谢。", "发票请发到邮箱 [EMAIL]，谢谢。", {"email": 1}),
    ("url", "see https://shop.example.com/orders/98234123?token=abc now", "see [URL] now", {"url": 1}),
    ("url", "profile: https://x.com/user/alice/", "profile: [URL]", {"url": 1}),
    ("url", "reset at www.example.com/reset?session=9f8e7d6c5b4a39281706 .", "reset at [URL] .", {"url": 1}),
    ("url", "http://t.cn/p/3f9a8b7c6d5e4f3a2b1c0d9e。", "[URL]。", {"url": 1}),
    ("id_card", "身份证 110101199003071233 丢了", "身份证 [ID] 丢了", {"id_card": 1}),
    ("id_card", "ID 11010519491231002X.", "ID [ID].", {"id_card": 1}),
    ("id_card", "Is my account ID 110101199003071233 safe?", "Is my account ID [ID] safe?", {"id_card": 1}),
    ("order", "My order number is 20231129000123.", "My order number is [ORDER].", {"order": 1}),
    ("order", "order #A12345 is late", "order #[ORDER] is late", {"order": 1}),
    ("order", "订单号：202311290001，什么时候退款？", "订单号：[ORDER]，什么时候退款？", {"order": 1}),
    ("order", "tracking number: 1Z999AA10123456784", "tracking number: [ORDER]", {"order": 1}),
    ("order", "运单号 SF1234567890 一直没更新", "运单号 [ORDER] 一直没更新", {"order": 1}),
    ("account", "account 6222020200112233445 frozen", "account [ACCOUNT] frozen", {"account": 1}),
    ("account", "user id: u12345 cannot log in", "user id: [ACCOUNT] cannot log in", {"account": 1}),
    ("account", "卡号：6222020200112233445", "卡号：[ACCOUNT]", {"account": 1}),
    ("account", "我的QQ号 12345678 被盗了", "我的QQ号 [ACCOUNT] 被盗了", {"account": 1}),
    ("phone_cn_mobile", "我的手机号是13812345678，快递没到", "我的手机号是[PHONE]，快递没到", {"phone_cn_mobile": 1}),
    ("phone_cn_mobile", "call +86 138-1234-5678 please", "call [PHONE] please", {"phone_cn_mobile": 1}),
    ("phone_cn_landline", "座机 010-62345678", "座机 [PHONE]", {"phone_cn_landline": 1}),
    ("phone_cn_landline", "客服电话(0755)88889999", "客服电话[PHONE]", {"phone_cn_landline": 1}),
    ("phone_intl", "Call me at +1 415-555-0132.", "Call me at [PHONE].", {"phone_intl": 1}),
    ("phone_intl", "office (415) 555-0132", "office [PHONE]", {"phone_intl": 1}),
    ("phone_intl", "call +44 20 7946 0958 now", "call [PHONE] now", {"phone_intl": 1}),
    ("phone_intl", "Berlin: +49 30 12345678.", "Berlin: [PHONE].", {"phone_intl": 1}),
    ("long_number", "card 6222020200112233445 was charged twice", "card [NUMBER] was charged twice",
     {"long_number": 1}),
    # Issue 24 S4: the documented kinds as people also write them (each missed before).
    ("phone_cn_landline", "座机 010 62345678 转 8", "座机 [PHONE] 转 8", {"phone_cn_landline": 1}),
    ("phone_cn_landline", "深圳 0755 86345678", "深圳 [PHONE]", {"phone_cn_landline": 1}),
    ("phone_cn_landline", "call 010-6234-5678", "call [PHONE]", {"phone_cn_landline": 1}),
    ("id_card", "身份证 110105 19491231 002X 丢了", "身份证 [ID] 丢了", {"id_card": 1}),
    ("id_card", "ID 110105-19491231-002X.", "ID [ID].", {"id_card": 1}),
    ("account", "卡号 6222 0212 3456 7890 被冻结", "卡号 [ACCOUNT] 被冻结", {"account": 1}),
    ("account", "account number: 1234 5678 9012.", "account number: [ACCOUNT].", {"account": 1}),
    ("email", "邮箱 zhangsan＠example.com 收不到", "邮箱 [EMAIL] 收不到", {"email": 1}),
    ("email", "write to info@bücher-münchen.de", "write to [EMAIL]", {"email": 1}),
    ("email", "почта ivan@пример.рф", "почта [EMAIL]", {"email": 1}),
    ("email", "发到 li@例子.中国谢谢", "发到 [EMAIL]谢谢", {"email": 1}),
    ("phone_cn_mobile", "手机 138.1234.5678", "手机 [PHONE]", {"phone_cn_mobile": 1}),
    ("phone_national", "ring 07700 900123 today", "ring [PHONE] today", {"phone_national": 1}),
    ("phone_national", "Büro (030) 12345678", "Büro [PHONE]", {"phone_national": 1}),
    ("phone_national", "Tel. 089/1234567", "Tel. [PHONE]", {"phone_national": 1}),
    ("phone_national", "Leeds 01632 960123", "Leeds [PHONE]", {"phone_national": 1}),
]
NEAR_MISSES = [
    ("email", "user@localhost has no domain"),  # no top-level domain
    ("email", "a@b.c"),  # one-letter top-level domain
    ("email", "follow @handle for news"),  # no local part
    ("url", "docs at https://example.com/docs/intro."),  # no identifier
    ("url", "https://example.com/search?q=refund+policy&page=2"),  # query without an identifying parameter
    ("url", "https://en.wikipedia.org/wiki/Rubric"),
    ("url", "see http://dx.doi.org/10.1155/2013/684237 )"),  # short numeric segments are not user ids
    ("id_card", "110101199003071234"),  # wrong check digit (the long number catches it)
    ("id_card", "110101199002301233"),  # 30 February
    ("id_card", "11010119900307123"),  # 17 digits
    ("order", "It arrives in 3 to 5 days, order 2 items"),  # value shorter than 5 characters
    ("order", "in order to win, 订单已发货"),  # no number
    ("account", "my account is locked, 账户余额不足"),
    ("account", "User: ICD-10 codes?"),  # a role label is not an account context
    ("phone_cn_mobile", "128-1234-5678"),  # no mobile prefix 12x
    ("phone_cn_mobile", "pi is 3.14159265359"),  # digits after a decimal point
    ("phone_cn_landline", "010-123456 and 2023-11-29"),  # too short, a date
    ("phone_intl", "+5 points, +1 2 3"),  # too few digits
    ("phone_intl", "version 1.2.3, 38.5 degrees"),
    ("long_number", "12345678 and 1,000,000,000 and 3.14159265358979"),  # 8 digits, grouped, decimals
    ("phone_national", "Room 0101 2nd floor, 01 2023, 0 500 yen"),  # too few digits, no area code
]
# Ordinary numbers no pattern may touch (the looser shapes above must not over-scrub): years, prices,
# quantities, dates, versions, standards, grouped thousands.
ORDINARY = [
    "In 2023 we sold 1500 units at ¥1999 each, up from 980 in 2022.",
    "The population is 1 400 000 000 and the budget 50 000 000 yuan.",
    "Between 2023-11-29 and 2024-01-01 prices were 0.99, 1.99 and 10 000.",
    "ISO 9001 2015 and GB/T 19001-2016 apply; version 1.2.3; pi 3.1415 9265.",
    "scores 100 200 300 400; order 2 items; account 2023 budget rose 12.5%.",
    "共 3 500 件，单价 129.00 元，2024 年 3 月 15 日发货。",
    "Temperatures 38.5 39.1 40.2; flight CA 1234 at 10:30; page 0012.",
]


@pytest.mark.parametrize("kind, text, expected, counts", POSITIVES)
def test_each_kind_is_replaced(kind, text, expected, counts):
    assert kind in counts
    assert pii.scrub_pii(text) == (expected, counts)


@pytest.mark.parametrize("kind, text", NEAR_MISSES)
def test_near_misses_are_not_that_kind(kind, text):
    scrubbed, counts = pii.scrub_pii(text)
    assert kind not in counts
    if kind != "id_card":  # an invalid ID card number is still a long number
        assert (scrubbed, counts) == (text, {})


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_numbers_are_left_alone(text):
    assert pii.scrub_pii(text) == (text, {})


def test_every_kind_has_a_positive_and_a_near_miss():
    assert {k for k, *_ in POSITIVES} == {k for k, _ in NEAR_MISSES} == set(pii.PII_KINDS)


def test_id_card_check_digit_and_date():
    assert pii.id_card_is_valid("11010519491231002X") and pii.id_card_is_valid("11010519491231002x")
    assert not pii.id_card_is_valid("110105194912310021")  # check digit
    assert not pii.id_card_is_valid("110105194913310028")  # month 13


def test_counts_add_up_over_kinds():
    text = "Mail a@example.com or b@example.org, call 13812345678 or +1 415-555-0132, order no. 98765."
    assert pii.scrub_pii(text) == (
        "Mail [EMAIL] or [EMAIL], call [PHONE] or [PHONE], order no. [ORDER].",
        {"email": 2, "phone_cn_mobile": 1, "phone_intl": 1, "order": 1})


def _unbounded_repeats(parsed):
    """Repetitions without an upper bound anywhere in a parsed pattern (sre_parse tree)."""
    c = sre_constants
    for op, av in parsed:
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            if av[1] == c.MAXREPEAT:
                yield op
            yield from _unbounded_repeats(av[2])
        elif op in (c.SUBPATTERN, c.ATOMIC_GROUP):
            yield from _unbounded_repeats(av[-1])
        elif op in (c.ASSERT, c.ASSERT_NOT):
            yield from _unbounded_repeats(av[1])
        elif op == c.BRANCH:
            for branch in av[1]:
                yield from _unbounded_repeats(branch)


def test_the_bound_check_sees_unbounded_repeats():
    for unbounded in (r"a+", r"(?:x|(?=b*))", r"(c{2,})?"):
        assert list(_unbounded_repeats(sre_parser.parse(unbounded))) != [], unbounded
    assert list(_unbounded_repeats(sre_parser.parse(r"(?<!x)a{1,64}(?:b|c{0,3})?"))) == []


@pytest.mark.parametrize("pattern", pii.PATTERNS, ids=lambda p: p.kind)
def test_every_repetition_is_bounded(pattern):
    assert list(_unbounded_repeats(sre_parser.parse(pattern.regex.pattern, pattern.regex.flags))) == []


ADVERSARIAL = [
    "a" * 100_000, "a." * 50_000, "a@" * 50_000, "@a." * 33_333, "1" * 100_000, "1-" * 50_000, "1 " * 50_000,
    "+1 " * 33_333, "http://" + "a/" * 50_000, "https://x.com/?" + "a=1&" * 25_000, "order " * 20_000,
    "订单号" * 33_333, "order number is " + "1-" * 50_000, "account#" * 12_500, "(010)" * 20_000, "1." * 50_000,
]


@pytest.mark.parametrize("text", ADVERSARIAL, ids=lambda t: repr(t[:12]))
def test_adversarial_100k_character_inputs_finish(text):
    # Catastrophic backtracking would make this run for hours; bounded patterns keep it linear.
    scrubbed, counts = pii.scrub_pii(text)
    assert isinstance(scrubbed, str) and all(v >= 0 for v in counts.values())


def test_texts_beyond_the_cap_are_refused():
    with pytest.raises(pii.PiiError, match="longer than"):
        pii.scrub_pii("x" * (pii.MAX_TEXT_CHARS + 1))
