"""Ed25519 signature verification (RFC 8032) and nkeys account public keys,
in pure Python: the standard library only, for the signed decisions of
docs/protocol.md ("Signed decisions").

    key = account_key("AAB2CB576PHBBPQ5ODORRZ2LYCMWPZGWGCN2KDK7DXOIMZASKUY3QPZV")
    verify(key, message, signature)  # True or False

It verifies; it never signs, so it holds no secret and need not run in
constant time. Points are kept in extended coordinates (X, Y, Z, T), with
x = X/Z, y = Y/Z and x*y = T/Z, so that no step divides: a verification
takes a few milliseconds.
"""

import base64
import hashlib
import re

# The curve: -x^2 + y^2 = 1 + d*x^2*y^2 over the integers modulo P, and the
# order L of its base point B (RFC 8032, section 5.1).
P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
D = -121665 * pow(121666, P - 2, P) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)  # a square root of -1 modulo P


def _recover_x(y, sign):
    """The x of the point with this y whose lowest bit is sign, or None
    (RFC 8032, section 5.1.3, steps 2 to 4)."""
    if y >= P:
        return None  # a non-canonical encoding of y
    u, v = (y * y - 1) % P, (D * y * y + 1) % P
    x = u * pow(v, 3, P) * pow(u * pow(v, 7, P), (P - 5) // 8, P) % P
    if (v * x * x - u) % P != 0:
        if (v * x * x + u) % P != 0:
            return None  # x^2 = u/v has no root: not a point
        x = x * SQRT_M1 % P
    if x == 0 and sign == 1:
        return None  # -0 is not an encoding
    return P - x if (x & 1) != sign else x


def _decode_point(b):
    """The point of a 32-byte encoding, or None if it encodes none or is not
    canonical (RFC 8032, section 5.1.3)."""
    n = int.from_bytes(b, "little")
    y, sign = n & ((1 << 255) - 1), n >> 255
    x = _recover_x(y, sign)
    return None if x is None else (x, y, 1, x * y % P)


def _add(p, q):
    """p + q (RFC 8032, section 5.1.4; the formulas hold for p == q too)."""
    a = (p[1] - p[0]) * (q[1] - q[0]) % P
    b = (p[1] + p[0]) * (q[1] + q[0]) % P
    c = 2 * p[3] * q[3] * D % P
    d = 2 * p[2] * q[2] % P
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % P, g * h % P, f * g % P, e * h % P)


def _mul(s, p):
    """[s]p, by double and add."""
    q = (0, 1, 1, 0)  # the neutral element
    while s > 0:
        if s & 1:
            q = _add(q, p)
        p = _add(p, p)
        s >>= 1
    return q


def _equal(p, q):
    """Whether p and q are the same point: X1/Z1 == X2/Z2 and Y1/Z1 == Y2/Z2."""
    return (p[0] * q[2] - q[0] * p[2]) % P == 0 and (p[1] * q[2] - q[1] * p[2]) % P == 0


def _base_point():
    y = 4 * pow(5, P - 2, P) % P  # 4/5
    x = _recover_x(y, 0)
    return (x, y, 1, x * y % P)


B = _base_point()


def verify(public, message, signature):
    """Whether signature (64 bytes) is an Ed25519 signature of message (bytes)
    by the key public (32 bytes): RFC 8032, section 5.1.7, checking
    [S]B == R + [k]A without the cofactor, as most libraries do, Go's
    crypto/ed25519 among them."""
    if len(public) != 32 or len(signature) != 64:
        return False
    a, r = _decode_point(public), _decode_point(signature[:32])
    s = int.from_bytes(signature[32:], "little")
    if a is None or r is None or s >= L:
        return False
    k = int.from_bytes(hashlib.sha512(signature[:32] + public + message).digest(), "little") % L
    return _equal(_mul(s, B), _add(r, _mul(k, a)))


# ---- nkeys public keys (docs/protocol.md, "Signed decisions") ----

ACCOUNT_PREFIX = 0x00  # the first byte of an account key, which makes it read "A..."
_PUBLIC_KEY = re.compile(r"[A-Z2-7]{56}")


def crc16_xmodem(data):
    """CRC-16/XMODEM: polynomial 0x1021, initial value 0, no reflection."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021 if crc & 0x8000 else crc << 1) & 0xFFFF
    return crc


def account_key(public):
    """The 32-byte Ed25519 public key inside an nkeys account public key
    ("A...", 56 characters): the RFC 4648 base32 of 35 bytes, without
    padding: the prefix byte 0x00, the key, and the CRC-16/XMODEM of those
    33 bytes, least significant byte first. Raises ValueError for anything
    else, a key of another type or a wrong checksum."""
    if not isinstance(public, str) or not _PUBLIC_KEY.fullmatch(public):
        raise ValueError("not 56 characters of base32 (A-Z, 2-7)")
    raw = base64.b32decode(public)
    if raw[0] != ACCOUNT_PREFIX:
        raise ValueError(f"prefix byte 0x{raw[0]:02x}, not an account key's (0x00)")
    if crc16_xmodem(raw[:33]) != int.from_bytes(raw[33:], "little"):
        raise ValueError("its checksum does not match")
    return raw[1:33]
