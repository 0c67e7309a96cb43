"""Tests of ed25519_verify.py and of the agent's check of signed decisions:

    python3 test_ed25519_verify.py

RFC 8032's test vectors (section 7.1), signatures that must not verify,
nkeys account public keys, and the worked example of docs/protocol.md
("Signed decisions"), which Go's pkg/events and the TypeScript agent check
too. integration/examples_test.go runs it.
"""

import base64
import json
import os
import re
import unittest

import agent
from ed25519_verify import L, account_key, crc16_xmodem, verify

# RFC 8032, section 7.1: (public key, message, signature), in hex. The
# 1023-byte message of TEST 1024 is M1023, at the end of the file.
RFC8032 = {
    "TEST 1": (
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
        "",
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
    ),
    "TEST 2": (
        "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
        "72",
        "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
    ),
    "TEST 3": (
        "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
        "af82",
        "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a",
    ),
}


def vectors():
    """The vectors as bytes, TEST 1024 included."""
    out = {name: tuple(bytes.fromhex(h) for h in v) for name, v in RFC8032.items()}
    out["TEST 1024"] = (
        bytes.fromhex("278117fc144c72340f67d0f2316e8386ceffbf2b2428c9c51fef7c597f1d426e"),
        bytes.fromhex("".join(M1023.split())),
        bytes.fromhex("d686294b743c6760c6a78a2c4c2fc76115c2600b8f083acde59e7cee32578c0f"
                      "59ea4219ab9b5896795e4e2b87a30270aa0e3099eee944e9e67a1b22df41ff07"),
    )
    return out


def flip(b, i, bit=0):
    """b with one bit of byte i flipped."""
    out = bytearray(b)
    out[i] ^= 1 << bit
    return bytes(out)


def le(n):
    """n as 32 bytes, least significant first: how Ed25519 writes numbers."""
    return n.to_bytes(32, "little")


def account_public(raw):
    """The nkeys account public key ("A...") of a 32-byte Ed25519 key."""
    body = b"\x00" + raw
    return base64.b32encode(body + crc16_xmodem(body).to_bytes(2, "little")).decode()


P = 2**255 - 19
IDENTITY = le(1)  # the neutral point (0, 1), encoded canonically


class RFC8032Test(unittest.TestCase):
    def test_vectors_verify(self):
        for name, (public, message, signature) in vectors().items():
            with self.subTest(name):
                self.assertTrue(verify(public, message, signature))
        self.assertEqual(len(vectors()["TEST 1024"][1]), 1023)

    def test_flipped_bits_do_not_verify(self):
        for name, (public, message, signature) in vectors().items():
            changed = {
                "the message": (public, flip(message, 0) if message else b"\x00", signature),
                "R": (public, message, flip(signature, 0)),
                "S": (public, message, flip(signature, 40)),
                "S's top byte": (public, message, flip(signature, 63, 4)),
                "the key": (flip(public, 0), message, signature),
                "the key's sign bit": (flip(public, 31, 7), message, signature),
            }
            for what, (pub, msg, sig) in changed.items():
                with self.subTest(f"{name}, {what}"):
                    self.assertFalse(verify(pub, msg, sig))

    def test_s_not_below_l(self):
        # S + L works in the group equation just as S does: only the check
        # S < L refuses it (RFC 8032, section 5.1.7, step 1).
        public, message, signature = vectors()["TEST 2"]
        s = int.from_bytes(signature[32:], "little")
        for what, bad in {"S + L": s + L, "L": L, "2^256 - 1": 2**256 - 1}.items():
            with self.subTest(what):
                self.assertFalse(verify(public, message, signature[:32] + le(bad)))

    def test_lengths(self):
        public, message, signature = vectors()["TEST 1"]
        self.assertFalse(verify(public[:31], message, signature))
        self.assertFalse(verify(public, message, signature[:63]))
        self.assertFalse(verify(public, message, signature + b"\x00"))

    def test_non_canonical_points(self):
        # The neutral point as key, R the neutral point and S = 0 satisfy
        # [S]B == R + [k]A for every message (a small-order key: here only
        # to show that the encodings alone are refused). y = 1 + P encodes
        # the same point non-canonically, and the sign bit set on x = 0 is
        # "-0": RFC 8032's decoding refuses both, for the key and for R.
        zero = le(0)
        self.assertTrue(verify(IDENTITY, b"m", IDENTITY + zero))
        for name, encoding in {"y = 1 + P": le(1 + P), "-0": le(1 | 1 << 255)}.items():
            with self.subTest(name):
                self.assertFalse(verify(encoding, b"m", IDENTITY + zero), "as the key")
                self.assertFalse(verify(IDENTITY, b"m", encoding + zero), "as R")

    def test_not_a_point(self):
        # y = 2: (y^2 - 1) / (d y^2 + 1) has no square root modulo P.
        public, message, signature = vectors()["TEST 1"]
        self.assertFalse(verify(le(2), message, signature))
        self.assertFalse(verify(public, message, le(2) + signature[32:]))


class AccountKeyTest(unittest.TestCase):
    def test_crc16_xmodem(self):
        self.assertEqual(crc16_xmodem(b"123456789"), 0x31C3)  # the check value of the CRC catalogue

    def test_doc_key(self):
        # The key of the worked example: seed bytes 0x00 to 0x1f.
        self.assertEqual(account_key(doc_example()["public key"]).hex(),
                         "03a107bff3ce10be1d70dd18e74bc09967e4d6309ba50d5f1ddc8664125531b8")

    def test_refused(self):
        good = "AAB2CB576PHBBPQ5ODORRZ2LYCMWPZGWGCN2KDK7DXOIMZASKUY3QPZV"
        raw = base64.b32decode(good)
        crc = crc16_xmodem(b"\xa0" + raw[1:33]).to_bytes(2, "little")
        for name, key in {
            "a changed character": good[:10] + ("A" if good[10] != "A" else "B") + good[11:],
            "too short": good[:-1],
            "too long": good + "A",
            "lower case": good.lower(),
            "padded": good[:-1] + "=",
            "a user key, checksum right": base64.b32encode(b"\xa0" + raw[1:33] + crc).decode(),
            "a seed": "SAAAAAICAMCAKBQHBAEQUCYMBUHA6EARCIJRIFIWC4MBSGQ3DQOR4HYMHI",
            "empty": "",
        }.items():
            with self.subTest(name):
                with self.assertRaises(ValueError):
                    account_key(key)


# ---- The worked example of docs/protocol.md ----

PROTOCOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "protocol.md")


def doc_example():
    """The code blocks of the worked example of docs/protocol.md ("Signed
    decisions"), by what they hold, each without its final line feed."""
    if not os.path.exists(PROTOCOL):
        raise unittest.SkipTest(f"{PROTOCOL} is not there (run from the repository)")
    with open(PROTOCOL, encoding="utf-8") as f:
        doc = f.read()
    heading = "\n### Worked example: a signed decision\n"
    section = doc[doc.index(heading) + len(heading):].split("\n## ")[0]
    blocks = re.findall(r"\n```[a-z]*\n(.*?)\n```\n", section, re.S)
    names = ["seed", "public key", "event", "canonical text", "assentsig", "python"]
    if len(blocks) != len(names):
        raise AssertionError(f"the worked example has {len(blocks)} code blocks, want {len(names)}")
    return dict(zip(names, blocks))


class DocExampleTest(unittest.TestCase):
    def setUp(self):
        self.ex = doc_example()
        self.event = json.loads(self.ex["event"])
        self.trusted = {self.ex["public key"]}

    def test_canonical_text(self):
        self.assertEqual(agent.canonical_decision(self.event), self.ex["canonical text"].encode())
        self.assertEqual(self.event["assentsig"], self.ex["assentsig"])

    def test_no_canonical_text(self):
        def changed(field, value):
            e = json.loads(self.ex["event"])
            e["data"][field] = value
            return e

        self.assertIsNotNone(agent.canonical_decision(changed("request_id", "12345")))
        for name, event in {
            "a JSON number": changed("request_id", agent.Number("12345")),
            "a line feed": changed("outcome", "approved\n"),
            "a carriage return": changed("outcome", "approved\r"),
            "a lone surrogate": changed("outcome", "approved\ud800"),
            "decided_at missing": changed("decided_at", None),
            "no data": {"id": self.event["id"]},
        }.items():
            with self.subTest(name):
                self.assertIsNone(agent.canonical_decision(event))

    def test_verifies(self):
        self.assertTrue(agent.signed_by_trusted(self.event, self.trusted))
        signature = base64.urlsafe_b64decode(self.ex["assentsig"].split(".")[2] + "==")
        self.assertTrue(verify(account_key(self.ex["public key"]),
                               self.ex["canonical text"].encode(), signature))

    def test_changed_events_do_not_verify(self):
        def changed(field, value):
            e = json.loads(self.ex["event"])
            (e if field in ("id", "assentsig") else e["data"])[field] = value
            return e

        sig = self.event["assentsig"]
        other = account_public(vectors()["TEST 1"][0])  # trusted too, but it did not sign
        self.trusted.add(other)
        cases = {
            "outcome": changed("outcome", "denied"),
            "args_digest": changed("args_digest", "sha256:" + "0" * 64),
            "request_digest absent": changed("request_digest", None),
            "id": changed("id", "0193a5b3-0000-7000-8000-000000000003"),
            "decided_at written otherwise": changed("decided_at", "2025-01-02T03:04:05.250Z"),
            "no signature": changed("assentsig", None),
            "scheme v2": changed("assentsig", "v2" + sig[2:]),
            "another trusted key named": changed("assentsig", "v1." + other + sig[59:]),
            "signature changed": changed("assentsig", sig[:-2] + ("A" if sig[-2] != "A" else "B") + sig[-1]),
            "signature bits after the last byte": changed("assentsig", sig[:-1] + chr(ord(sig[-1]) + 1)),
            "signature padded": changed("assentsig", sig + "=="),
        }
        for name, event in cases.items():
            with self.subTest(name):
                self.assertFalse(agent.signed_by_trusted(event, self.trusted))
        # A change to a field the signature does not cover still verifies.
        self.assertTrue(agent.signed_by_trusted(changed("reason", "another reason"), self.trusted))
        self.assertFalse(agent.signed_by_trusted(self.event, {other}), "its key not trusted")


# RFC 8032, section 7.1, TEST 1024: the message, 1023 bytes.
M1023 = """
08b8b2b733424243760fe426a4b54908632110a66c2f6591eabd3345e3e4eb98fa6e264bf09efe12ee50f8f54e9f77b1
e355f6c50544e23fb1433ddf73be84d879de7c0046dc4996d9e773f4bc9efe5738829adb26c81b37c93a1b270b20329d
658675fc6ea534e0810a4432826bf58c941efb65d57a338bbd2e26640f89ffbc1a858efcb8550ee3a5e1998bd177e93a
7363c344fe6b199ee5d02e82d522c4feba15452f80288a821a579116ec6dad2b3b310da903401aa62100ab5d1a36553e
06203b33890cc9b832f79ef80560ccb9a39ce767967ed628c6ad573cb116dbeffefd75499da96bd68a8a97b928a8bbc1
03b6621fcde2beca1231d206be6cd9ec7aff6f6c94fcd7204ed3455c68c83f4a41da4af2b74ef5c53f1d8ac70bdcb7ed
185ce81bd84359d44254d95629e9855a94a7c1958d1f8ada5d0532ed8a5aa3fb2d17ba70eb6248e594e1a2297acbbb39
d502f1a8c6eb6f1ce22b3de1a1f40cc24554119a831a9aad6079cad88425de6bde1a9187ebb6092cf67bf2b13fd65f27
088d78b7e883c8759d2c4f5c65adb7553878ad575f9fad878e80a0c9ba63bcbcc2732e69485bbc9c90bfbd62481d9089
beccf80cfe2df16a2cf65bd92dd597b07e0917af48bbb75fed413d238f5555a7a569d80c3414a8d0859dc65a46128bab
27af87a71314f318c782b23ebfe808b82b0ce26401d2e22f04d83d1255dc51addd3b75a2b1ae0784504df543af8969be
3ea7082ff7fc9888c144da2af58429ec96031dbcad3dad9af0dcbaaaf268cb8fcffead94f3c7ca495e056a9b47acdb75
1fb73e666c6c655ade8297297d07ad1ba5e43f1bca32301651339e22904cc8c42f58c30c04aafdb038dda0847dd988dc
da6f3bfd15c4b4c4525004aa06eeff8ca61783aacec57fb3d1f92b0fe2fd1a85f6724517b65e614ad6808d6f6ee34dff
7310fdc82aebfd904b01e1dc54b2927094b2db68d6f903b68401adebf5a7e08d78ff4ef5d63653a65040cf9bfd4aca79
84a74d37145986780fc0b16ac451649de6188a7dbdf191f64b5fc5e2ab47b57f7f7276cd419c17a3ca8e1b939ae49e48
8acba6b965610b5480109c8b17b80e1b7b750dfc7598d5d5011fd2dcc5600a32ef5b52a1ecc820e308aa342721aac094
3bf6686b64b2579376504ccc493d97e6aed3fb0f9cd71a43dd497f01f17c0e2cb3797aa2a2f256656168e6c496afc5fb
93246f6b1116398a346f1a641f3b041e989f7914f90cc2c7fff357876e506b50d334ba77c225bc307ba537152f3f1610
e4eafe595f6d9d90d11faa933a15ef1369546868a7f3a45a96768d40fd9d03412c091c6315cf4fde7cb68606937380db
2eaaa707b4c4185c32eddcdd306705e4dc1ffc872eeee475a64dfac86aba41c0618983f8741c5ef68d3a101e8a3b8cac
60c905c15fc910840b94c00a0b9d00
"""

if __name__ == "__main__":
    unittest.main()
