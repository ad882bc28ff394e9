# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_claimgate_global_optspecs
    string join \n redis-url= db= stream= group= log-format= audit-log= redis-wait-replicas= redis-wait-ms= env-file= h/help V/version
end

function __fish_claimgate_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_claimgate_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_claimgate_using_subcommand
    set -l cmd (__fish_claimgate_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c claimgate -n "__fish_claimgate_needs_command" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_needs_command" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_needs_command" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_needs_command" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_needs_command" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_needs_command" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_needs_command" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_needs_command" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_needs_command" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_needs_command" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_needs_command" -f -a "run" -d 'Run the worker: read submissions, record each exactly once, acknowledge after commit'
complete -c claimgate -n "__fish_claimgate_needs_command" -f -a "status" -d 'Show ledger counts and totals, stream length, pending entries and backlog'
complete -c claimgate -n "__fish_claimgate_needs_command" -f -a "relay" -d 'Publish unpublished outbox rows to the events stream, each event exactly once'
complete -c claimgate -n "__fish_claimgate_needs_command" -f -a "audit" -d 'Export or verify the hash-chained audit trail'
complete -c claimgate -n "__fish_claimgate_needs_command" -f -a "verify" -d 'Check the ledger against itself and the audit chain; exit 1 naming the first violation'
complete -c claimgate -n "__fish_claimgate_needs_command" -f -a "retention" -d 'Purge records older than the retention window (exported first; never automatic)'
complete -c claimgate -n "__fish_claimgate_needs_command" -f -a "hold" -d 'Place, lift or list legal holds on awards (held awards are never purged)'
complete -c claimgate -n "__fish_claimgate_needs_command" -f -a "dlq" -d 'Inspect dead letters, replay one onto the submissions stream, or decide a conflict held for review (approve: pay it once; reject: never)'
complete -c claimgate -n "__fish_claimgate_needs_command" -f -a "backup" -d 'Copy the ledger consistently (while workers run) to a new file, mode 0600'
complete -c claimgate -n "__fish_claimgate_needs_command" -f -a "restore" -d 'Put a backup in place of the ledger (no worker may have it open); the ledger replaced is kept beside it, and every disbursement in the backup reaches the events stream once'
complete -c claimgate -n "__fish_claimgate_needs_command" -f -a "migrate" -d 'Copy the --db SQLite ledger into an empty PostgreSQL ledger, audit chain unchanged'
complete -c claimgate -n "__fish_claimgate_needs_command" -f -a "init" -d 'Make the ledger (or upgrade one an earlier release made), then exit: on PostgreSQL, run it as the role that owns the schema before the workers start as theirs'
complete -c claimgate -n "__fish_claimgate_needs_command" -f -a "key" -d 'Print the idempotency key of a payload'
complete -c claimgate -n "__fish_claimgate_needs_command" -f -a "produce" -d 'Queue submissions: each line of a JSON-lines file (or stdin) becomes one stream entry'
complete -c claimgate -n "__fish_claimgate_needs_command" -f -a "demo" -d 'The whole pipeline on a private redis-server and a temporary ledger, then a summary and an auditor\'s report (it uses its own temporary ledger and stream keys)'
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l consumer -d 'This consumer\'s name in the group [default: host name and pid]' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l threads -d 'Threads that parse, validate and hash entries' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l claim-idle-ms -d 'Take over entries other consumers have left idle this long' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l max-deliveries -d 'Dead-letter an entry delivered more than this many times' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l quarantine-spacing-ms -d 'The least time between two tries alone of an entry past --max-deliveries, doubled after each try (30 s, 60 s, then 120 s before it is dead-lettered): a crash storm shorter than that cannot dead-letter a valid entry' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l payload-bytes-max -d 'Refuse payloads larger than this many bytes (checked before parsing; also the limit of every other field, and the entry\'s limit with 64 KiB more); 256 to 512 MiB (a limit below any submission\'s size would dead-letter every entry)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l amount-cents-max -d 'Dead-letter (`amount_too_large`) any submission whose amount_cents is over this. The default, 100000000000 cents ($1 billion), is above any single grant disbursement' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l batch-count-max -d 'Entries asked for per read' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l read-bytes-max -d 'The most entry bytes the worker holds at once, read and not yet acknowledged (with a fixed cost per field); reads ask Redis for no more than what is left. At least what one entry of --payload-bytes-max may weigh (that plus 192 KiB)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l fast-filter-ttl-s -d 'Lifetime of a --fast-filter marker, in seconds' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l synchronous -d 'SQLite synchronous level: full (default; survives power loss) or normal' -r -f -a "full\t'fsync the WAL at every commit: a committed claim survives power loss'
normal\t'fsync only at checkpoints: a power loss may roll back recent commits (never corrupts)'"
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l on-conflict -d 'What to do with a resubmission reusing an award\'s timestamp with a different payload: record (pay it and leave a conflict record) or hold (dead-letter it for review)' -r -f -a "record\t'Pay it (it is a distinct submission by design) and leave a `conflict` audit record'
hold\t'Dead-letter it for review instead of paying'"
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l events-stream -d 'The events stream outbox rows are published to' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l relay-batch-count-max -d 'Outbox rows published per round (one Redis script call, one ledger transaction)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l republish-from -d 'When the events stream stands below what the ledger marked published and Redis says its events were deleted, trimmed, or lost with the stream and its mark, the relay refuses and names the missing ids; this says where to go on from: the first missing id to publish them again, or the id after the last to leave them out. Used once' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l ledger-pages-max -d 'Cap the ledger at this many pages (PRAGMA max_page_count); when it is full the worker leaves entries pending and retries until room is made' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l ledger-outage-ms-max -d 'Wait this long (ms) for a failure of the ledger as a whole (a privilege revoked, a read-only or damaged file, a missing schema) to clear before exiting 1; entries stay pending meanwhile, nothing is dead-lettered for it, and /healthz is 503' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l metrics-addr -d 'Serve Prometheus /metrics and /healthz on this HOST:PORT' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l anchor-every -d 'Take an anchor of the audit chain this often (500ms, 30s, 5m, 1h) and once more on stopping; needs --anchor-out and/or --anchor-stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l anchor-out -d 'Append each anchor to this file (0600, created if absent)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l anchor-stream -d 'Add each anchor to this Redis stream (field `anchor`), e.g. grants:audit:anchors' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l signing-key -d 'Sign each anchor with this key file (`claimgate audit keygen`)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l exit-when-idle -d 'Exit 0 once the stream has no undelivered entries and the group none pending'
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l per-message -d 'One transaction and one XACK per entry (the reference design\'s shape; slow, for comparison)'
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l fast-filter -d 'Skip the claim lookup for entries Redis marks as already committed (markers are written only after their commit; a miss asks the ledger)'
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -l relay -d 'Also run the outbox relay in this process (single-box setups)'
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand run" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand status" -l watch -d 'Redraw every SECONDS (default 2) until Ctrl-C, with processed, duplicate and dead-letter rates per second, lag, oldest pending age, outbox backlog and commit p99' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand status" -l metrics-url -d 'The worker\'s /metrics URL (http://HOST:PORT/metrics), read by --watch for commit p99 [default: http://$CLAIMGATE_METRICS_ADDR/metrics when that is set]' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand status" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand status" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand status" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand status" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand status" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand status" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand status" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand status" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand status" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand status" -l json -d 'Print JSON instead of a table (with --watch: one compact JSON line per interval)'
complete -c claimgate -n "__fish_claimgate_using_subcommand status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand status" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand relay" -l events-stream -d 'The events stream outbox rows are published to' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand relay" -l relay-batch-count-max -d 'Outbox rows published per round (one Redis script call, one ledger transaction)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand relay" -l republish-from -d 'When the events stream stands below what the ledger marked published and Redis says its events were deleted, trimmed, or lost with the stream and its mark, the relay refuses and names the missing ids; this says where to go on from: the first missing id to publish them again, or the id after the last to leave them out. Used once' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand relay" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand relay" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand relay" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand relay" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand relay" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand relay" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand relay" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand relay" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand relay" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand relay" -l exit-when-idle -d 'Exit 0 once no outbox row is left unpublished'
complete -c claimgate -n "__fish_claimgate_using_subcommand relay" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand relay" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and not __fish_seen_subcommand_from export verify anchor report keygen" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and not __fish_seen_subcommand_from export verify anchor report keygen" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and not __fish_seen_subcommand_from export verify anchor report keygen" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and not __fish_seen_subcommand_from export verify anchor report keygen" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and not __fish_seen_subcommand_from export verify anchor report keygen" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and not __fish_seen_subcommand_from export verify anchor report keygen" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and not __fish_seen_subcommand_from export verify anchor report keygen" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and not __fish_seen_subcommand_from export verify anchor report keygen" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and not __fish_seen_subcommand_from export verify anchor report keygen" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and not __fish_seen_subcommand_from export verify anchor report keygen" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and not __fish_seen_subcommand_from export verify anchor report keygen" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and not __fish_seen_subcommand_from export verify anchor report keygen" -f -a "export" -d 'Write the audit records as JSON lines, each with its prev_hash and hash'
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and not __fish_seen_subcommand_from export verify anchor report keygen" -f -a "verify" -d 'Recompute the hash chain; exit 1 naming the first broken record, or (with --anchors) every anchor the chain contradicts'
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and not __fish_seen_subcommand_from export verify anchor report keygen" -f -a "anchor" -d 'Write one JSON line describing the chain\'s head now (seq, hash, records, time, ledger id), verified first; signed when a signing key is given'
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and not __fish_seen_subcommand_from export verify anchor report keygen" -f -a "report" -d 'Write one self-contained HTML report an auditor opens offline: the verdict first (verified against the anchors and key given, or FAILED naming the first broken record or anchor), then the ledger, the chain head, each anchor, totals disbursed per day or month, the counts, holds, purges and exceptions. Exit 1 (the report still written) when the ledger does not verify'
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and not __fish_seen_subcommand_from export verify anchor report keygen" -f -a "keygen" -d 'Make an Ed25519 key pair: the signing key at PATH, the public key at PATH.pub (both new 0600 files; existing files are never overwritten)'
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from export" -l out -d 'Write here instead of stdout' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from export" -l since -d 'Only records from this seq, or written at or after this RFC 3339 time' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from export" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from export" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from export" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from export" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from export" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from export" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from export" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from export" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from export" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from export" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from export" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from verify" -l file -d 'Verify an exported file instead of the ledger' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from verify" -l continuing-from -d 'With --file: the hash the file\'s first record links to (an export made with --since)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from verify" -l anchors -d 'Check the ledger against the anchors in this file (`claimgate audit anchor` lines)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from verify" -l public-key -d 'Require every checkpoint (and every anchor) to be signed by this key\'s signing key (with --file: every checkpoint in the file)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from verify" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from verify" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from verify" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from verify" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from verify" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from verify" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from verify" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from verify" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from verify" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from verify" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from verify" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from anchor" -l out -d 'Append the line to this file (created 0600 if absent) instead of printing it' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from anchor" -l signing-key -d 'Sign the anchor with this key file (`claimgate audit keygen`)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from anchor" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from anchor" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from anchor" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from anchor" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from anchor" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from anchor" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from anchor" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from anchor" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from anchor" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from anchor" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from anchor" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from report" -l out -d 'The HTML file to write: a new 0600 file (an existing file is never overwritten)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from report" -l anchors -d 'Check the ledger against the anchors in this file (`claimgate audit anchor` lines)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from report" -l public-key -d 'Require every checkpoint and anchor to be signed by this key\'s signing key' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from report" -l since -d 'Count only records written at or after this date (YYYY-MM-DD, UTC) or RFC 3339 date-time. The whole chain is verified whatever the period' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from report" -l until -d 'Count only records written before this date (YYYY-MM-DD, UTC) or RFC 3339 date-time' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from report" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from report" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from report" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from report" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from report" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from report" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from report" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from report" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from report" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from report" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from report" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from keygen" -l out -d 'Where to write the signing key; the public key goes to the same path plus `.pub`' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from keygen" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from keygen" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from keygen" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from keygen" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from keygen" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from keygen" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from keygen" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from keygen" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from keygen" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from keygen" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand audit; and __fish_seen_subcommand_from keygen" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand verify" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand verify" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand verify" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand verify" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand verify" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand verify" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand verify" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand verify" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand verify" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand verify" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand verify" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and not __fish_seen_subcommand_from purge" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and not __fish_seen_subcommand_from purge" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and not __fish_seen_subcommand_from purge" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and not __fish_seen_subcommand_from purge" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and not __fish_seen_subcommand_from purge" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and not __fish_seen_subcommand_from purge" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and not __fish_seen_subcommand_from purge" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and not __fish_seen_subcommand_from purge" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and not __fish_seen_subcommand_from purge" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and not __fish_seen_subcommand_from purge" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and not __fish_seen_subcommand_from purge" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and not __fish_seen_subcommand_from purge" -f -a "purge" -d 'Export, then delete, everything recorded before DATE (at least three years back)'
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and __fish_seen_subcommand_from purge" -l before -d 'A date (YYYY-MM-DD, midnight UTC) or RFC 3339 date-time' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and __fish_seen_subcommand_from purge" -l export -d 'The export file [default: next to the ledger, `<db>.purge-<time>.jsonl`]' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and __fish_seen_subcommand_from purge" -l batch-records-max -d 'Audit records removed per transaction, with the ledger rows they describe' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and __fish_seen_subcommand_from purge" -l signing-key -d 'Sign the checkpoint the purge leaves with this key file (`claimgate audit keygen`)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and __fish_seen_subcommand_from purge" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and __fish_seen_subcommand_from purge" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and __fish_seen_subcommand_from purge" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and __fish_seen_subcommand_from purge" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and __fish_seen_subcommand_from purge" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and __fish_seen_subcommand_from purge" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and __fish_seen_subcommand_from purge" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and __fish_seen_subcommand_from purge" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and __fish_seen_subcommand_from purge" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and __fish_seen_subcommand_from purge" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand retention; and __fish_seen_subcommand_from purge" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and not __fish_seen_subcommand_from add remove list" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and not __fish_seen_subcommand_from add remove list" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and not __fish_seen_subcommand_from add remove list" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and not __fish_seen_subcommand_from add remove list" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and not __fish_seen_subcommand_from add remove list" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and not __fish_seen_subcommand_from add remove list" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and not __fish_seen_subcommand_from add remove list" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and not __fish_seen_subcommand_from add remove list" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and not __fish_seen_subcommand_from add remove list" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and not __fish_seen_subcommand_from add remove list" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and not __fish_seen_subcommand_from add remove list" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and not __fish_seen_subcommand_from add remove list" -f -a "add" -d 'Place an award under legal hold: nothing naming it will be purged'
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and not __fish_seen_subcommand_from add remove list" -f -a "remove" -d 'Lift a legal hold'
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and not __fish_seen_subcommand_from add remove list" -f -a "list" -d 'List awards under legal hold'
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from add" -l reason -d 'Why (a case number, an auditor\'s request)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from add" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from add" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from add" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from add" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from add" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from add" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from add" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from add" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from add" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from add" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from add" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from remove" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from remove" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from remove" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from remove" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from remove" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from remove" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from remove" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from remove" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from remove" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from remove" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from remove" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from list" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from list" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from list" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from list" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from list" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from list" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from list" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from list" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from list" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand hold; and __fish_seen_subcommand_from list" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and not __fish_seen_subcommand_from list show replay reconcile approve reject" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and not __fish_seen_subcommand_from list show replay reconcile approve reject" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and not __fish_seen_subcommand_from list show replay reconcile approve reject" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and not __fish_seen_subcommand_from list show replay reconcile approve reject" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and not __fish_seen_subcommand_from list show replay reconcile approve reject" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and not __fish_seen_subcommand_from list show replay reconcile approve reject" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and not __fish_seen_subcommand_from list show replay reconcile approve reject" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and not __fish_seen_subcommand_from list show replay reconcile approve reject" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and not __fish_seen_subcommand_from list show replay reconcile approve reject" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and not __fish_seen_subcommand_from list show replay reconcile approve reject" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and not __fish_seen_subcommand_from list show replay reconcile approve reject" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and not __fish_seen_subcommand_from list show replay reconcile approve reject" -f -a "list" -d 'List dead letters: id, time, award id where known, reason, whether it was replayed and, for a conflict held for review, whether a reviewer decided it'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and not __fish_seen_subcommand_from list show replay reconcile approve reject" -f -a "show" -d 'Show one dead letter with all its fields (ID: the dead-letter id, or the original entry id) and, for a conflict held for review, the ledger\'s decision'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and not __fish_seen_subcommand_from list show replay reconcile approve reject" -f -a "replay" -d 'Put a dead letter\'s original fields back on the submissions stream, once'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and not __fish_seen_subcommand_from list show replay reconcile approve reject" -f -a "reconcile" -d 'Copy again every dead letter the ledger records but the dead-letter stream lacks (after a Redis failover lost some); never copies one entry twice'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and not __fish_seen_subcommand_from list show replay reconcile approve reject" -f -a "approve" -d 'Approve a conflict held for review (run --on-conflict hold): pay it once, exactly as a new submission, and record who approved it and why, in one ledger transaction'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and not __fish_seen_subcommand_from list show replay reconcile approve reject" -f -a "reject" -d 'Reject a conflict held for review: nothing is paid; record who rejected it and why'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from list" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from list" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from list" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from list" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from list" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from list" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from list" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from list" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from list" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from list" -l json -d 'Print a JSON array instead of a table'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from list" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from show" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from show" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from show" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from show" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from show" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from show" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from show" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from show" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from show" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from show" -l json -d 'Print JSON instead of text'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from show" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from show" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from replay" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from replay" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from replay" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from replay" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from replay" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from replay" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from replay" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from replay" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from replay" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from replay" -l anyway -d 'Replay it even though it is still malformed as it stands (the worker\'s own limits may differ from the defaults it is checked against here)'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from replay" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from replay" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reconcile" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reconcile" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reconcile" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reconcile" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reconcile" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reconcile" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reconcile" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reconcile" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reconcile" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reconcile" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reconcile" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from approve" -l by -d 'Who decides (a name the audit trail keeps; one line, at most 128 characters)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from approve" -l reason -d 'Why (kept in the audit trail; one line, at most 1000 characters)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from approve" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from approve" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from approve" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from approve" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from approve" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from approve" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from approve" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from approve" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from approve" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from approve" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from approve" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reject" -l by -d 'Who decides (a name the audit trail keeps; one line, at most 128 characters)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reject" -l reason -d 'Why (kept in the audit trail; one line, at most 1000 characters)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reject" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reject" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reject" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reject" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reject" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reject" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reject" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reject" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reject" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reject" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand dlq; and __fish_seen_subcommand_from reject" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand backup" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand backup" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand backup" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand backup" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand backup" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand backup" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand backup" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand backup" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand backup" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand backup" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand backup" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand restore" -l events-stream -d 'The events stream the relay publishes to (its mark tells which rows are published)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand restore" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand restore" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand restore" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand restore" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand restore" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand restore" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand restore" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand restore" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand restore" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand restore" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand restore" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand migrate" -l to -d 'The empty PostgreSQL ledger to copy the --db SQLite ledger into (postgres://…; the password is never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand migrate" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand migrate" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand migrate" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand migrate" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand migrate" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand migrate" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand migrate" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand migrate" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand migrate" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand migrate" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand migrate" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand init" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand init" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand init" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand init" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand init" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand init" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand init" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand init" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand init" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand init" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand init" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand key" -l award-id -d 'The award id, exactly as in the payload' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand key" -l timestamp -d 'The submission timestamp, exactly as in the payload' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand key" -l payload-file -d 'File holding the payload, one line as `claimgate produce` reads it (`-` for stdin): its line ending is not part of the payload, as produce does not send it' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand key" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand key" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand key" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand key" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand key" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand key" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand key" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand key" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand key" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand key" -l exact -d 'Take every byte of the file as the payload, a trailing newline included (a payload another producer sent with one)'
complete -c claimgate -n "__fish_claimgate_using_subcommand key" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand key" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand produce" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand produce" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand produce" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand produce" -l redis-url -d 'Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with ?sentinel_password=P for sentinels that have one; credentials allowed; never logged)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand produce" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand produce" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand produce" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand produce" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand produce" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand produce" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand produce" -s V -l version -d 'Print version'
complete -c claimgate -n "__fish_claimgate_using_subcommand demo" -l submissions -d 'Distinct valid submissions to feed (resends and malformed entries come on top)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand demo" -l seed -d 'Seed for the generated submissions' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand demo" -l report -d 'Where to write the audit report the demo ends with (a new file; default `claimgate-demo-report-<UTC time>.html` in the current directory)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand demo" -l db -d 'The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL ledger (credentials allowed; never shown)' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand demo" -l stream -d 'The submissions stream' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand demo" -l group -d 'The consumer group' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand demo" -l audit-log -d 'Append audit lines (target claimgate::audit) to this file instead of stderr' -r -F
complete -c claimgate -n "__fish_claimgate_using_subcommand demo" -l redis-wait-replicas -d 'Writes that should survive a Redis failover (dead-letter copies, produce, the relay\'s publish) wait until this many replicas have them (WAIT); default 1 with a redis+sentinel:// URL, 0 (no wait) otherwise' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand demo" -l redis-wait-ms -d 'How long such a write waits for its replicas before it is reported as failed' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand demo" -l redis-url -d 'Use this Redis instead of a private redis-server started for the demo (only when given on the command line; the demo writes only fresh claimgate-demo-* keys there and deletes them afterwards)' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand demo" -l log-format -d 'Log line format' -r -f -a "human\t'`2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`'
json\t'`{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`'"
complete -c claimgate -n "__fish_claimgate_using_subcommand demo" -l env-file -d 'Read settings not given by a flag or the environment from this file, with systemd\'s EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service\'s, when it exists]; \'\' reads none' -r
complete -c claimgate -n "__fish_claimgate_using_subcommand demo" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c claimgate -n "__fish_claimgate_using_subcommand demo" -s V -l version -d 'Print version'
