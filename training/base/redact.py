"""Secrets out of what a run prints or stores: a password or token inside a URI, a DSN or a
flag's value becomes `***` wherever a flag, a URI or an error is written (MLflow params and
tags, TensorBoard's hparams, the checkpoint's args, sweep and search tables, error and status
lines). The value given is still the one used to connect; only its shown form is redacted.

Three forms are caught, anywhere in a text:
- the password of a URI's userinfo, `scheme://user:PASSWORD@host` (the user name is kept);
- a query parameter whose name says it is a secret, `?password=`, `&token=`, `sslkey=`, ...;
- libpq's keyword form, `password=...` standing alone in a DSN.
"""
import re

MASK = "***"
# Words that mark a query parameter or a DSN keyword as secret, anywhere in its name
# (access_token, client_secret, api_key, sslpassword, X-Amz-Signature, ...).
SECRET_WORDS = ("password", "passwd", "pwd", "token", "secret", "key", "credential", "signature",
                "auth")

_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s?#]*):[^@\s]*@")
_NAME = r"[A-Za-z0-9_.\-]*(?:" + "|".join(SECRET_WORDS) + r")[A-Za-z0-9_.\-]*"
_QUERY = re.compile(r"(?P<head>[?&;]" + _NAME + r"=)[^&;\s#]*", re.IGNORECASE)
_KEYWORD = re.compile(r"(?P<head>(?:^|(?<=\s))" + _NAME + r"\s*=\s*)(?:'[^']*'|[^\s&;]+)",
                      re.IGNORECASE)


def redact(text):
    """`text` with every secret of a URI, a query or a DSN replaced by `***`; anything that is
    not a string is returned as it is."""
    if not isinstance(text, str):
        return text
    text = _USERINFO.sub(lambda m: m["head"] + ":" + MASK + "@", text)
    text = _QUERY.sub(lambda m: m["head"] + MASK, text)
    return _KEYWORD.sub(lambda m: m["head"] + MASK, text)


def redacted(value):
    """A flag's value as it may be shown or stored: strings redacted, also inside lists and
    tuples and as a dict's values."""
    if isinstance(value, dict):
        return {k: redacted(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(redacted(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(redacted(v) for v in value)
    return redact(value)


def flags(args):
    """vars(args), every value as it may be shown or stored (redacted)."""
    return {k: redacted(v) for k, v in vars(args).items()}
