"""PII scrubbing: emails, URLs with identifiers, Chinese ID-card numbers, order and account numbers, phones.

Written the ways people write them: an ID card or an account number in groups with spaces or hyphens, a
fullwidth '＠' or an internationalised domain, a mobile number with dots, a landline with a space, national
(UK, German) numbers with a trunk 0. Ordinary numbers (years, prices, quantities, dates) are left alone.

Each kind is one pattern (plus, where the shape alone is ambiguous, a check on the match: the ID-card
check digit and birth date, the digit count of an international phone, the identifier in a URL). The
patterns run in a fixed order so a specific shape wins over a general one (an ID-card number is not
also a long number), and each replaces its match with a placeholder ('[EMAIL]', ...). Order and
account numbers are found through a context word (English or Chinese: 'order number', '订单号',
'account', '卡号', ...) that is kept; only the number is replaced.

Every repetition in every pattern has an upper bound and every match starts at a boundary the pattern
checks first, so the work per character is bounded (no catastrophic backtracking); texts longer than
MAX_TEXT_CHARS are refused rather than scanned.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import re
import urllib.parse
from collections.abc import Callable

MAX_TEXT_CHARS = 2_000_000

# Context words before an order or account number; the value must hold a digit in its first 13 characters.
_SEPARATOR = r"(?:\s{0,3}(?:is|was|:|：|#|为|是)){0,2}\s{0,3}#?\s{0,3}"
_VALUE = (r"(?P<value>\d{3,6}(?:[ \u00a0-]\d{3,6}){1,6}(?!\d)"  # digits in groups: 6222 0212 3456 7890
          r"|(?=[0-9A-Za-z-]{0,12}\d)[0-9A-Za-z][0-9A-Za-z-]{4,39})")
_EN_SUFFIX = r"(?:\s{0,3}(?:number|num|no\.?|id|#))?"
_ORDER_WORDS = (rf"\b(?:order|tracking|waybill){_EN_SUFFIX}"
                r"|订单(?:号码|编号|号)?|运单号?|快递单号|物流单号|单号")
_ACCOUNT_WORDS = (rf"\b(?:account|acct){_EN_SUFFIX}"
                  r"|\b(?:card|member(?:ship)?|customer|user|login)\s{0,3}(?:number|num|no\.?|id)"
                  r"|账号|帐号|账户|帐户|卡号|银行卡号?|信用卡号?|会员卡?号|用户(?:名|编号|ID|id)|客户(?:编号|号)|QQ号?|微信号?")

# Query parameters and path segments that name a person, a session or a secret.
_URL_ID_PARAMS = frozenset({
    "id", "uid", "user", "userid", "user_id", "username", "token", "access_token", "refresh_token", "auth",
    "key", "apikey", "api_key", "session", "sessionid", "session_id", "sid", "email", "phone", "mobile",
    "account", "order", "orderid", "order_id", "code", "sig", "signature", "password", "pwd", "ticket", "openid",
})
_URL_ID_SEGMENTS = frozenset({"user", "users", "u", "profile", "profiles", "account", "accounts", "member",
                              "members", "customer", "customers", "order", "orders", "id", "people", "person"})
_ID_CARD_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
# Internationalised e-mail domains end in an ASCII or punycode TLD, a Cyrillic one or a Chinese one (the
# CJK TLDs are listed: a run of Han characters after a domain is usually the sentence going on).
_EMAIL_TLD = (r"(?:[A-Za-z]{2,24}|xn--[A-Za-z0-9-]{2,59}|[\u0400-\u04ff]{2,24}|中国|中國|香港|台湾|台灣|新加坡|公司|网络"
              r"|網絡|在线|中文网)")

class PiiError(ValueError):
    """A text that cannot be scrubbed (longer than MAX_TEXT_CHARS)."""


def id_card_is_valid(number: str) -> bool:
    """An 18-character PRC resident ID: a real birth date and the ISO 7064 MOD 11-2 check character."""
    try:
        datetime.date(int(number[6:10]), int(number[10:12]), int(number[12:14]))
    except ValueError:
        return False
    check = "10X98765432"[sum(int(d) * w for d, w in zip(number[:17], _ID_CARD_WEIGHTS)) % 11]
    return number[17].upper() == check


def _looks_like_identifier(token: str) -> bool:
    """Nine or more digits, or a 16+ character token mixing letters and digits (hex ids, uuids, base64)."""
    if len(token) >= 9 and token.isdigit():
        return True
    return (len(token) >= 16 and all(c.isalnum() or c in "-_" for c in token)
            and any(c.isdigit() for c in token) and any(c.isalpha() for c in token))


def url_has_identifier(url: str) -> bool:
    """True when a query parameter or path segment identifies a user, session, order or secret."""
    parts = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
    for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=False):
        if name.casefold() in _URL_ID_PARAMS or _looks_like_identifier(value):
            return True
    segments = [s for s in parts.path.split("/") if s]
    for previous, segment in zip([""] + segments, segments):
        if previous.casefold() in _URL_ID_SEGMENTS or _looks_like_identifier(segment):
            return True
    return False


def _phone_digits_ok(number: str) -> bool:
    """E.164 allows 8 to 15 digits including the country code."""
    return 8 <= sum(c.isdigit() for c in number) <= 15


@dataclasses.dataclass(frozen=True)
class PiiPattern:
    """One kind of PII: its report name, placeholder, pattern, and an optional check on the match text."""

    kind: str
    placeholder: str
    regex: re.Pattern[str]
    check: Callable[[str], bool] | None = None


# Applied in this order. A group named 'value' (context-word kinds) is all that is replaced.
PATTERNS: tuple[PiiPattern, ...] = (
    PiiPattern("email", "[EMAIL]", re.compile(  # '@' or the fullwidth '＠'; domain labels of any script
        r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}[@＠](?:[^\W_]|-){1,63}(?:\.(?:[^\W_]|-){1,63}){0,8}"
        rf"\.{_EMAIL_TLD}(?![A-Za-z0-9\u0400-\u04ff-])")),
    PiiPattern("url", "[URL]", re.compile(
        r"(?<![A-Za-z0-9])(?:https?://|www\.)[^\s<>\"'(){}\[\]，。、；：！？）》」]{0,2000}"
        r"[^\s<>\"'(){}\[\]，。、；：！？）》」.,;:!?]", re.IGNORECASE), url_has_identifier),
    PiiPattern("id_card", "[ID]", re.compile(  # also written 6-8-4 with spaces or hyphens
        r"(?<![0-9A-Za-z])[1-9]\d{5}([ -]?)(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])\1\d{3}[\dXx]"
        r"(?![0-9A-Za-z])"), lambda match: id_card_is_valid(re.sub(r"[ -]", "", match))),
    PiiPattern("order", "[ORDER]", re.compile(rf"(?:{_ORDER_WORDS}){_SEPARATOR}{_VALUE}", re.IGNORECASE)),
    PiiPattern("account", "[ACCOUNT]", re.compile(rf"(?:{_ACCOUNT_WORDS}){_SEPARATOR}{_VALUE}", re.IGNORECASE)),
    PiiPattern("phone_cn_mobile", "[PHONE]", re.compile(
        r"(?<![\d+.,])(?:(?:\+|00)86[-\s]?)?1[3-9]\d(?:[-.\s]?\d{4}){2}(?!\d)")),
    PiiPattern("phone_cn_landline", "[PHONE]", re.compile(  # (010) / 010- / 010 + 7-8 digits, maybe split 3/4-4
        r"(?<![\d.,-])(?:\(0\d{2,3}\)\s?|0\d{2,3}[- ])(?:[2-9]\d{6,7}|[2-9]\d{2,3}([- ])\d{4})(?![\d-])")),
    PiiPattern("phone_intl", "[PHONE]", re.compile(
        r"(?<![\w+.])(?:\+\d{1,3}[-.\s]?)?(?:\(\d{3}\)\s?|\d{3}[-.\s])\d{3}[-.\s]\d{4}(?!\d)"
        r"|(?<![\w+])\+(?:\d{1,4}(?:[-.\s]\d{1,8}){1,5}|\d{7,15})(?!\d)"), _phone_digits_ok),
    PiiPattern("phone_national", "[PHONE]", re.compile(  # UK/DE national format: trunk 0, area, subscriber
        r"(?<![\d.,/+-])(?:\(0[1-9]\d{1,4}\)\s?|0[1-9]\d{1,4}[ /-])[1-9]\d{2,7}(?:[ -]\d{3,4})?(?![\d/-])"),
        lambda match: 10 <= sum(c.isdigit() for c in match) <= 12),
    PiiPattern("long_number", "[NUMBER]", re.compile(r"(?<![\d.,])\d{9,64}(?![\d])")),
)
PII_KINDS: tuple[str, ...] = tuple(p.kind for p in PATTERNS)


def scrub_pii(text: str) -> tuple[str, dict[str, int]]:
    """(scrubbed text, {kind: number of replacements}) with every kind of PATTERNS applied in order."""
    if len(text) > MAX_TEXT_CHARS:
        raise PiiError(f"text of {len(text):,} characters is longer than the {MAX_TEXT_CHARS:,} PII scrubbing scans")
    counts: collections.Counter[str] = collections.Counter()
    for pattern in PATTERNS:
        def replace(m: re.Match[str], p: PiiPattern = pattern) -> str:
            if p.check is not None and not p.check(m.group(0)):
                return m.group(0)
            counts[p.kind] += 1
            if "value" in p.regex.groupindex:
                start, end = m.span("value")
                return m.group(0)[: start - m.start()] + p.placeholder + m.group(0)[end - m.start():]
            return p.placeholder
        text = pattern.regex.sub(replace, text)
    return text, dict(counts)
