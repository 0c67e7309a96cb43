// Signed decisions (docs/protocol.md, "Signed decisions"), checked with
// node:crypto alone: the nkeys account public key that names the broker's
// decision key, the canonical text of a decided event, and its Ed25519
// signature in the assentsig attribute, "v1.<public key>.<signature>".

import { createPublicKey, verify, type KeyObject } from "node:crypto";

const ACCOUNT_PREFIX = 0x00; // the first byte of an account key, which makes it read "A..."
const BASE32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"; // RFC 4648

// accountKey returns the Ed25519 key inside an nkeys account public key
// ("A...", 56 characters): the RFC 4648 base32 of 35 bytes, without padding:
// the prefix byte 0x00, the 32-byte key, and the CRC-16/XMODEM of those 33
// bytes, least significant byte first. It throws for anything else, a key
// of another type or a wrong checksum.
export function accountKey(publicKey: string): KeyObject {
  if (!/^[A-Z2-7]{56}$/.test(publicKey)) throw new Error("not 56 characters of base32 (A-Z, 2-7)");
  const raw = base32Decode(publicKey);
  if (raw[0] !== ACCOUNT_PREFIX) throw new Error(`prefix byte 0x${raw[0].toString(16)}, not an account key's (0x00)`);
  if (crc16xmodem(raw.subarray(0, 33)) !== raw.readUInt16LE(33)) throw new Error("its checksum does not match");
  // A JSON Web Key of the raw 32 bytes (RFC 8037).
  return createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: raw.subarray(1, 33).toString("base64url") }, format: "jwk" });
}

// signedByTrusted reports whether a trusted key signed event, a decided
// event in structured mode: its assentsig names a trusted key, and the
// Ed25519 signature verifies over the event's canonical text with that key.
export function signedByTrusted(event: Record<string, unknown>, trusted: Set<string>): boolean {
  const parts = typeof event.assentsig === "string" ? event.assentsig.split(".") : [];
  if (parts.length !== 3 || parts[0] !== "v1" || !trusted.has(parts[1])) return false;
  const text = canonicalDecision(event);
  const signature = Buffer.from(parts[2], "base64url");
  // Written exactly so: unpadded base64url of 64 bytes, the bits after the
  // last byte zero (Buffer.from skips what is not base64url).
  if (text === undefined || signature.length !== 64 || signature.toString("base64url") !== parts[2]) return false;
  try {
    return verify(null, text, accountKey(parts[1]), signature);
  } catch {
    return false;
  }
}

// canonicalDecision returns the text a decided event's signature covers:
// seven lines joined by "\n", in UTF-8, or undefined if it has none (a value
// missing, not a string, or holding a line break).
export function canonicalDecision(event: Record<string, unknown>): Buffer | undefined {
  if (typeof event.data !== "object" || event.data === null) return undefined;
  const d = event.data as Record<string, unknown>;
  const lines = [
    "assent-decision-v1",
    event.id,
    d.request_id,
    d.outcome,
    d.args_digest ?? "",
    d.request_digest ?? "",
    d.decided_at,
  ];
  if (!lines.every((l) => typeof l === "string" && !/[\r\n]/.test(l))) return undefined;
  const text = lines.join("\n");
  const utf8 = Buffer.from(text, "utf8");
  return utf8.toString("utf8") === text ? utf8 : undefined; // a lone surrogate has no UTF-8
}

// crc16xmodem is CRC-16/XMODEM: polynomial 0x1021, initial value 0, no
// reflection.
function crc16xmodem(data: Uint8Array): number {
  let crc = 0;
  for (const byte of data) {
    crc ^= byte << 8;
    for (let i = 0; i < 8; i++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc;
}

// base32Decode reads RFC 4648 base32 without padding, of characters
// already checked to be in the alphabet.
function base32Decode(text: string): Buffer {
  const out: number[] = [];
  let bits = 0;
  let value = 0;
  for (const c of text) {
    value = ((value << 5) | BASE32.indexOf(c)) & 0xfff; // the bits not yet written out
    bits += 5;
    if (bits >= 8) {
      bits -= 8;
      out.push((value >> bits) & 0xff);
    }
  }
  return Buffer.from(out);
}
