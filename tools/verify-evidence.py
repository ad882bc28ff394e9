#!/usr/bin/env python3
"""Check a claimgate audit export against its anchors, without claimgate.

    python3 verify-evidence.py --export audit.jsonl [--anchors anchors.jsonl]
                               [--public-key audit-key.pub] [--ledger-id ID]

An independent second implementation, for an auditor who should not have to trust the program
under review to check its own output: Python's standard library for the hashes, the `openssl`
command for Ed25519 signatures. It checks

  * every record's hash: sha256(prev_hash || canonical JSON of the record with "hash": ""),
  * both seals: records sealed one after another, and the batches a shared (PostgreSQL)
    ledger writes: members hashed among themselves from the genesis hash, each with its place
    in the batch as its seq, closed by a link record (kind "batch") naming how many members
    there are and the last one's hash, sealed after the chain's head,
  * a leading checkpoint left by a retention purge, and (with --public-key) every checkpoint's
    signature,
  * every anchor: its signature (with --public-key), its ledger, and that the chain holds the
    anchored hash at the anchored seq, or that a validly signed checkpoint older than the
    three-year retention window covers it.

Exit status: 0 everything holds, 1 something does not (each finding printed), 2 bad usage or a
file that cannot be read. docs/auditor.md (/usr/share/doc/claimgate/auditor.md) walks through
it. The rules are written out below in plain code on purpose: read them.
"""

import argparse
import base64
import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

GENESIS_HASH = "0" * 64
KINDS = {
    "processed", "duplicate", "dead_letter", "conflict", "checkpoint", "vanished",
    "hold_added", "hold_removed", "restored", "batch", "conflict_approved", "conflict_rejected",
}
ANCHOR_LABEL = b"claimgate anchor v1\n"
CHECKPOINT_LABEL = b"claimgate checkpoint v1\n"
CHECKPOINT_SIGNATURE_MARK = "; signed ed25519 "
PUBLIC_KEY_HEADER = "claimgate-ed25519-public-key"
RETENTION_YEARS = 3  # 2 CFR 200.334
# The DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410): what openssl reads a raw key in.
ED25519_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
HEX = re.compile(r"^[0-9a-fA-F]*$")
BATCH_LINK = re.compile(
    r"^batch (0|[1-9][0-9]*): (0|[1-9][0-9]*) records, last (.*?); "
    r"(0|[1-9][0-9]*) outbox rows from id (0|[1-9][0-9]*)$",
    re.DOTALL,
)


class Broken(Exception):
    """The chain, or a file, is not what it must be: (seq or None, reason)."""


class Usage(Exception):
    """Bad usage or a file that cannot be read (exit 2)."""


# --- canonical JSON: byte for byte what claimgate hashes and signs (serde_json, compact) ----

def jstr(s):
    """A JSON string: '"' and '\\' escaped, \\b \\t \\n \\f \\r by name, other characters below
    U+0020 as \\u00xx (lowercase hex); everything else, non-ASCII included, as it is."""
    named = {8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r"}
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif o < 0x20:
            out.append(named.get(o, "\\u%04x" % o))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def jopt(v):
    if v is None:
        return "null"
    if isinstance(v, str):
        return jstr(v)
    return str(v)


def canonical(r):
    """The record as hashed: its fields in this order, "hash" empty, no batch_index, and a batch
    member's place in its batch standing in for its seq."""
    seq = r["batch_index"] if r["batch_index"] is not None else r["seq"]
    return (
        '{"seq":%d,"kind":%s,"idempotency_key":%s,"award_id":%s,"amount_cents":%s,'
        '"stream_entry_id":%s,"consumer":%s,"delivery_count":%s,"detail":%s,'
        '"recorded_at":%s,"prev_hash":%s,"hash":""}'
        % (
            seq, jstr(r["kind"]), jopt(r["idempotency_key"]), jopt(r["award_id"]),
            jopt(r["amount_cents"]), jopt(r["stream_entry_id"]), jopt(r["consumer"]),
            jopt(r["delivery_count"]), jopt(r["detail"]), jstr(r["recorded_at"]),
            jstr(r["prev_hash"]),
        )
    )


def record_hash(r):
    h = hashlib.sha256(r["prev_hash"].encode("utf-8"))
    h.update(canonical(r).encode("utf-8"))
    return h.hexdigest()


# --- reading the export ----------------------------------------------------------------------

TEXT_FIELDS = ("idempotency_key", "award_id", "stream_entry_id", "consumer", "detail")
INT_FIELDS = ("amount_cents", "delivery_count")


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def parse_record(obj):
    """The record in a line, checked field by field, or None if it is not one."""
    if not isinstance(obj, dict):
        return None
    r = {}
    for f in ("seq", "kind", "recorded_at", "prev_hash", "hash") + TEXT_FIELDS + INT_FIELDS:
        if f not in obj:
            return None
        r[f] = obj[f]
    if not is_int(r["seq"]) or r["kind"] not in KINDS:
        return None
    for f in ("recorded_at", "prev_hash", "hash"):
        if not isinstance(r[f], str):
            return None
    for f in TEXT_FIELDS:
        if r[f] is not None and not isinstance(r[f], str):
            return None
    for f in INT_FIELDS:
        if r[f] is not None and not is_int(r[f]):
            return None
    r["batch_index"] = obj.get("batch_index")
    if r["batch_index"] is not None and not is_int(r["batch_index"]):
        return None
    return r


def read_export(path):
    """Every audit record of an `audit export` file (or a purge export's audit_log lines)."""
    try:
        f = open(path, "r", encoding="utf-8", errors="strict")
    except OSError as e:
        raise Usage("cannot read %s: %s" % (path, e))
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                if isinstance(obj, dict) and "table" in obj:
                    if obj["table"] != "audit_log":
                        continue
                    obj = obj.get("row")
                r = parse_record(obj)
                if r is not None:
                    for v in r.values():
                        if isinstance(v, str):
                            v.encode("utf-8")  # a lone surrogate is no text claimgate wrote
            except (ValueError, UnicodeError):
                r = None
            if r is None:
                raise Broken(None, "%s line %d: not an audit record" % (path, n))
            yield r


# --- the chain ---------------------------------------------------------------------------------

class Chain:
    """Checks records one at a time, in file order (claimgate's Verifier, written again)."""

    def __init__(self, continuing_from=None):
        self.expected_prev = continuing_from  # what the next record sealed alone links to
        self.last_seq = None
        self.batch = None  # open batch: dict(first_seq, index, running, partial)
        self.count = 0  # records; links are seals, not records

    def head(self):
        return self.expected_prev if self.expected_prev is not None else GENESIS_HASH

    def push(self, r):
        closes = r["kind"] == "batch" and r["batch_index"] is None
        if self.last_seq is not None and (
            r["seq"] < self.last_seq or (r["seq"] == self.last_seq and not closes)
        ):
            raise Broken(r["seq"], "out of order after seq %d" % self.last_seq)
        if r["batch_index"] is not None:
            if r["kind"] in ("batch", "checkpoint"):
                raise Broken(r["seq"], "a %s record cannot be a batch member" % r["kind"])
            self.member(r)
        elif r["kind"] == "batch":
            self.link(r)
        else:
            self.single(r)
        self.last_seq = r["seq"]
        if not closes:
            self.count += 1

    def end(self):
        if self.batch is not None:
            raise Broken(
                self.batch["first_seq"],
                "the batch starting here has no link record (the chain ends inside it)",
            )

    def single(self, r):
        if self.batch is not None:
            raise Broken(r["seq"], "a %s record inside the batch whose members start at seq %d"
                         % (r["kind"], self.batch["first_seq"]))
        leading_checkpoint = self.expected_prev is None and r["kind"] == "checkpoint"
        if not leading_checkpoint and r["prev_hash"] != self.head():
            raise Broken(r["seq"], "prev_hash does not match the previous record's hash")
        check_hash(r)
        self.expected_prev = r["prev_hash"] if leading_checkpoint else r["hash"]

    def member(self, r):
        index, b = r["batch_index"], self.batch
        if b is not None:
            if index == 1:
                raise Broken(r["seq"], "a new batch starts before the batch whose members "
                             "start at seq %d was linked" % b["first_seq"])
            if index != b["index"] + 1:
                raise Broken(r["seq"], "batch member %d follows member %d" % (index, b["index"]))
            if r["seq"] != self.last_seq + 1:
                raise Broken(r["seq"], "batch members do not have consecutive seqs")
            expected, first_seq, partial = b["running"], b["first_seq"], b["partial"]
        elif index == 1:
            expected, first_seq, partial = GENESIS_HASH, r["seq"], False
        elif self.count == 0 and self.expected_prev is not None:
            # An export that starts inside a batch, continuing from the member before it.
            expected, first_seq, partial = self.head(), r["seq"], True
        else:
            raise Broken(r["seq"], "batch member %d without the members before it" % index)
        if r["prev_hash"] != expected:
            raise Broken(r["seq"], "prev_hash does not match the previous member's hash")
        check_hash(r)
        self.batch = dict(first_seq=first_seq, index=index, running=r["hash"], partial=partial)

    def link(self, r):
        b, self.batch = self.batch, None
        if b is None:
            raise Broken(r["seq"], "a batch link with no members before it")
        m = BATCH_LINK.match(r["detail"] or "")
        if m is None:
            raise Broken(r["seq"], "a batch link whose detail does not name its members")
        records, last_hash = int(m.group(2)), m.group(3)
        if self.last_seq != r["seq"]:
            raise Broken(r["seq"], "a batch link not at its last member's seq")
        if records != b["index"]:
            raise Broken(r["seq"], "the link names %d members but %d precede it"
                         % (records, b["index"]))
        if last_hash != b["running"]:
            raise Broken(r["seq"], "the link names %s as its last member's hash, but that "
                         "member hashes to %s" % (last_hash, b["running"]))
        if not b["partial"] and r["prev_hash"] != self.head():
            raise Broken(r["seq"], "prev_hash does not match the previous record's hash")
        check_hash(r)
        self.expected_prev = r["hash"]


def check_hash(r):
    if record_hash(r) != r["hash"]:
        raise Broken(r["seq"], "content does not match its hash (edited)")


# --- signatures --------------------------------------------------------------------------------

class PublicKey:
    def __init__(self, path):
        try:
            with open(path, "r", encoding="utf-8") as f:
                words = f.read().split()
        except (OSError, UnicodeError) as e:
            raise Usage("public key %s: %s" % (path, e))
        if len(words) != 2 or words[0] != PUBLIC_KEY_HEADER:
            raise Usage("%s: expected one line: %s <64 hex digits>" % (path, PUBLIC_KEY_HEADER))
        if len(words[1]) != 64 or not HEX.match(words[1]):
            raise Usage("%s: the key after %s is not 64 hex digits" % (path, PUBLIC_KEY_HEADER))
        self.raw = bytes.fromhex(words[1])
        self.key_id = hashlib.sha256(self.raw).hexdigest()[:16]
        self.openssl = shutil.which("openssl")
        if self.openssl is None:
            raise Usage("openssl is needed to check Ed25519 signatures (Debian: apt-get install openssl)")
        self.dir = tempfile.mkdtemp(prefix="verify-evidence-")
        der = ED25519_SPKI_PREFIX + self.raw
        self.pem = os.path.join(self.dir, "key.pem")
        with open(self.pem, "w") as f:
            f.write("-----BEGIN PUBLIC KEY-----\n%s\n-----END PUBLIC KEY-----\n"
                    % base64.b64encode(der).decode())

    def verifies(self, message, signature_hex):
        """True when signature_hex is this key's Ed25519 signature of message (openssl)."""
        if len(signature_hex) % 2 or not HEX.match(signature_hex):
            return False
        msg, sig = os.path.join(self.dir, "msg"), os.path.join(self.dir, "sig")
        with open(msg, "wb") as f:
            f.write(message)
        with open(sig, "wb") as f:
            f.write(bytes.fromhex(signature_hex))
        done = subprocess.run(
            [self.openssl, "pkeyutl", "-verify", "-pubin", "-inkey", self.pem, "-rawin",
             "-in", msg, "-sigfile", sig],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        return done.returncode == 0

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def check_checkpoint(r, key):
    """None if the checkpoint is signed by key, else what is wrong."""
    detail = r["detail"] or ""
    if CHECKPOINT_SIGNATURE_MARK not in detail:
        return "unsigned, but a public key was given"
    text, signed = detail.rsplit(CHECKPOINT_SIGNATURE_MARK, 1)
    signer, _, sig = signed.partition(" ")
    if signer != key.key_id:
        return "signed by key %s, not by %s" % (signer, key.key_id)
    message = CHECKPOINT_LABEL + (
        '{"seq":%d,"prev_hash":%s,"detail":%s}' % (r["seq"], jstr(r["prev_hash"]), jstr(text))
    ).encode("utf-8")
    if not key.verifies(message, sig):
        return "signature does not verify with key %s" % key.key_id
    return None


# --- anchors -----------------------------------------------------------------------------------

ANCHOR_FIELDS = ("ledger_id", "seq", "hash", "records", "recorded_at", "at", "key_id", "signature")


def parse_anchor(obj):
    if not isinstance(obj, dict) or set(obj) - set(ANCHOR_FIELDS):
        return None
    for f in ("ledger_id", "seq", "hash", "records", "at"):
        if f not in obj:
            return None
    a = {f: obj.get(f) for f in ANCHOR_FIELDS}
    if not is_int(a["seq"]) or not is_int(a["records"]) or a["records"] < 0:
        return None
    for f in ("ledger_id", "hash", "at"):
        if not isinstance(a[f], str):
            return None
    for f in ("recorded_at", "key_id", "signature"):
        if a[f] is not None and not isinstance(a[f], str):
            return None
    return a


def anchor_signed_bytes(a):
    """The label, then the anchor's JSON with every field but its signature, in order."""
    text = '{"ledger_id":%s,"seq":%d,"hash":%s,"records":%d,"recorded_at":%s,"at":%s' % (
        jstr(a["ledger_id"]), a["seq"], jstr(a["hash"]), a["records"], jopt(a["recorded_at"]),
        jstr(a["at"]),
    )
    if a["key_id"] is not None:
        text += ',"key_id":%s' % jstr(a["key_id"])
    return ANCHOR_LABEL + (text + "}").encode("utf-8")


def read_anchors(path):
    try:
        f = open(path, "r", encoding="utf-8")
    except OSError as e:
        raise Usage("cannot read anchors %s: %s" % (path, e))
    anchors = []
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                a = parse_anchor(json.loads(line))
            except ValueError:
                a = None
            if a is None:
                raise Broken(None, "%s line %d: not an anchor" % (path, n))
            a["line"] = n
            anchors.append(a)
    if not anchors:
        raise Broken(None, "%s holds no anchors: nothing to verify against" % path)
    return anchors


class Evidence:
    """Anchors and checkpoints against the chain (claimgate's EvidenceCheck, written again)."""

    def __init__(self, anchors, key, ledger_id, purgeable_before):
        self.key, self.purgeable_before = key, purgeable_before
        self.open = {}  # anchored seq -> anchors still to settle
        self.matched = self.covered = self.checkpoints_signed = 0
        self.failures = []  # (line or None, seq, reason)
        self.seen_any, self.last_seq = False, 0
        ledger = ledger_id if ledger_id is not None else (anchors[0]["ledger_id"] if anchors else None)
        for a in anchors:
            if a["ledger_id"] != ledger:
                whose = "this ledger is" if ledger_id is not None else "the first anchor names"
                self.fail(a["line"], a["seq"], "taken of ledger %s, but %s %s"
                          % (a["ledger_id"], whose, ledger))
                continue
            if key is not None:
                wrong = anchor_signature(a, key)
                if wrong:
                    self.fail(a["line"], a["seq"], wrong)
                    continue
            self.open.setdefault(a["seq"], []).append(a)

    def fail(self, line, seq, reason):
        self.failures.append((line, seq, reason))

    def push(self, r):
        leading = not self.seen_any and r["kind"] == "checkpoint"
        self.seen_any, self.last_seq = True, r["seq"]
        if r["kind"] == "checkpoint":
            valid = True
            if self.key is not None:
                wrong = check_checkpoint(r, self.key)
                if wrong:
                    self.fail(None, r["seq"], wrong)
                    valid = False
                else:
                    self.checkpoints_signed += 1
            if leading:
                self.settle_covered(r["seq"], valid)
        if r["batch_index"] is not None:
            # What seq n hashed to, where n ends a batch, is the hash of the link that follows.
            self.skipped_below(r["seq"])
            return
        hashed = r["prev_hash"] if leading else r["hash"]
        for a in self.open.pop(r["seq"], []):
            if a["hash"] == hashed:
                self.matched += 1
            else:
                self.fail(a["line"], r["seq"], "the record at seq %d hashes to %s, not the "
                          "anchored %s (edited or re-sealed since)" % (r["seq"], hashed, a["hash"]))
        self.skipped_below(r["seq"])

    def skipped_below(self, seq):
        for gone in sorted(s for s in self.open if s < seq):
            self.missing(gone, "no record at seq %d (the chain jumps past it to %d)" % (gone, seq))

    def settle_covered(self, seq, valid):
        for s in sorted(x for x in self.open if x < seq):
            for a in self.open.pop(s):
                if s == 0:
                    self.genesis(a)
                elif not valid:
                    self.fail(a["line"], s, "the record is gone, and the only checkpoint covering "
                              "it (seq %d) is not validly signed" % seq)
                elif a["recorded_at"] is None or a["recorded_at"] >= self.purgeable_before:
                    self.fail(a["line"], s, "the record is gone behind the checkpoint at seq %d, "
                              "but it was written at %s, inside the retention window"
                              % (seq, a["recorded_at"] or "an unknown time"))
                else:
                    self.covered += 1

    def genesis(self, a):
        if a["hash"] == GENESIS_HASH:
            self.matched += 1
        else:
            self.fail(a["line"], 0, "an anchor at seq 0 must carry the genesis hash, not %s"
                      % a["hash"])

    def missing(self, seq, why):
        for a in self.open.pop(seq, []):
            if seq == 0:
                self.genesis(a)
            else:
                self.fail(a["line"], seq, "the anchored record is missing: %s, and no "
                          "checkpoint covers it" % why)

    def finish(self):
        end = "the chain ends at seq %d" % self.last_seq if self.seen_any else "the chain is empty"
        for seq in sorted(self.open):
            self.missing(seq, end)


def anchor_signature(a, key):
    if a["signature"] is None:
        return "unsigned, but a public key was given"
    if a["key_id"] is not None and a["key_id"] != key.key_id:
        return "signed by key %s, not by %s" % (a["key_id"], key.key_id)
    if not key.verifies(anchor_signed_bytes(a), a["signature"]):
        return "signature does not verify with key %s" % key.key_id
    return None


def purgeable_before_now():
    """The retention window's start: a record written before it may have been purged by now."""
    now = datetime.datetime.now(datetime.timezone.utc)
    try:
        start = now.replace(year=now.year - RETENTION_YEARS)
    except ValueError:  # 29 February: the day before is conservative
        start = (now - datetime.timedelta(days=1)).replace(year=now.year - RETENTION_YEARS)
    return start.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- the command -------------------------------------------------------------------------------

def main(argv):
    p = argparse.ArgumentParser(
        description="Check a claimgate audit export (and its anchors) without claimgate.")
    p.add_argument("--export", required=True, help="`claimgate audit export` output")
    p.add_argument("--anchors", help="the anchors file (`claimgate audit anchor` lines)")
    p.add_argument("--public-key", help="the operator's public key file (*.pub): every "
                   "anchor and checkpoint must be signed by it")
    p.add_argument("--ledger-id", help="the ledger the anchors must name (the report's "
                   "'Ledger id'); without it, every anchor must name the same ledger as the first")
    p.add_argument("--continuing-from", help="the hash the export's first record links to "
                   "(an export made with --since)")
    p.add_argument("--purgeable-before", help="override the retention window's start "
                   "(ledger time, e.g. 2023-07-01T00:00:00.000000Z); default: three years ago")
    args = p.parse_args(argv)
    key = None
    try:
        key = PublicKey(args.public_key) if args.public_key else None
        anchors = read_anchors(args.anchors) if args.anchors else []
        if key is not None and anchors and all(a.get("signature") is None for a in anchors):
            # As claimgate says it: a key for anchors none of which is signed is a mistake of
            # the command line, not a contradiction of the ledger (one unsigned anchor among
            # signed ones is: a signature stripped).
            raise Usage("none of the %d anchor(s) is signed, so --public-key has nothing to "
                        "check them against: check them without it" % len(anchors))
        evidence = Evidence(anchors, key, args.ledger_id,
                            args.purgeable_before or purgeable_before_now())
        chain = Chain(args.continuing_from)
        for r in read_export(args.export):
            chain.push(r)
            evidence.push(r)
        chain.end()
        evidence.finish()
    except Usage as e:
        print("verify-evidence: %s" % e, file=sys.stderr)
        return 2
    except Broken as e:
        seq, reason = e.args
        where = "audit chain broken at seq %d: " % seq if seq is not None else ""
        print("FAILED: %s%s" % (where, reason), file=sys.stderr)
        return 1
    finally:
        if key is not None:
            key.close()
    print("audit chain intact: %d records, head %s" % (chain.count, chain.head()))
    if evidence.failures:
        print("FAILED: the export contradicts its evidence (%d finding(s)):"
              % len(evidence.failures), file=sys.stderr)
        for line, seq, reason in evidence.failures:
            what = ("anchor on line %d (seq %d)" % (line, seq) if line is not None
                    else "checkpoint at seq %d" % seq)
            print("  %s: %s" % (what, reason), file=sys.stderr)
        return 1
    if anchors:
        print("anchors hold: %d of %d found with the anchored hash, %d covered by a retention "
              "checkpoint" % (evidence.matched, len(anchors), evidence.covered))
    if key is not None:
        print("signatures verified with key %s: %d checkpoint(s)%s"
              % (key.key_id, evidence.checkpoints_signed, " and every anchor" if anchors else ""))
    print("OK: the export and its evidence agree")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
