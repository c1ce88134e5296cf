/* zcluster's Redis module: the scripts' commonest writes as native commands, for servers that load it
 * (redis-server --loadmodule <path>; `zcluster server-module` builds it and prints the path). Redis >= 7.0 or
 * Valkey: it refuses to load on an older server, whose sorted-set API ignores GT.
 *
 *   ZCLUSTER.WRITE numkeys K+ K- [K+ K- ...] op bound mode singles group...   lua/write.lua
 *   ZCLUSTER.INCR numkeys K+ K- [K+ K- ...] kind ttl group...                  lua/incr.lua
 *   ZCLUSTER.VERSION   -> PROTOCOL, the argument layout this build speaks (a client uses the module only when
 *                         it knows that number: zcluster/_server_module.py)
 *
 * Each command takes its script's arguments after the SHA and gives its reply, and decides, writes and stops
 * exactly where the script does, tuple by tuple in order (tests compare them on random calls). WRITE serves
 * the calls without floors (mode "0"), a size bound ("0") or a wait ("!"): the client sends every other call
 * to the script. A 2P-set insert of (m, s) is stale if K- records m at a score >= s; else it removes that
 * tombstone and adds m to K+, or raises m's score in K+ if s is higher (ZADD GT). A delete of (m, s) is
 * stale if K+ records m at a score > s; else it moves m from K+ to K- at s, or raises m's tombstone in K-. A
 * key of another kind stops the call where the script's command on it would fail ("|WRONGTYPE ..."). INCR's
 * rules are lua/incr.lua's, to the letter (its header). The one difference from the scripts: a call is read
 * whole before anything is written, so a malformed one (a bad count, a score or position that is not a
 * number, one key named twice in a group) is an error with nothing applied.
 *
 * Every change is replicated as the plain command it amounts to (ZADD K s m with the client's own text of s,
 * ZREM K m, ZINCRBY K d m, a counter's new total or a fence as HSET, a time to live as the server's own EXPIRE),
 * wrapped by the server with the call's other changes: replicas and the AOF never need the module. Every
 * change publishes the keyspace notification its command would: a migration's listener hears these writes.
 * What is not the same: a key opened is marked modified (WATCH, client tracking) even when the call finds
 * every tuple stale.
 *
 * Why one file past 500 lines: both commands share the server's API as bound at load (abi.h's static
 * pointers, one set per compiled file), the argument checks and the replication helpers; the server loads
 * one shared object.
 */
#include <stdio.h>
#include <string.h>

#include "abi.h"

#define PROTOCOL 1
#define NOTIFY_GENERIC (1 << 2)
#define NOTIFY_HASH (1 << 6)
#define NOTIFY_ZSET (1 << 7)
#define WRONGTYPE "|WRONGTYPE Operation against a key holding the wrong kind of value"

/* One change, replicated and published. */
static void added(RedisModuleCtx *ctx, RedisModuleString *key, RedisModuleString *score, RedisModuleString *m) {
    RM_Replicate(ctx, "ZADD", "sss", key, score, m);
    RM_NotifyKeyspaceEvent(ctx, NOTIFY_ZSET, "zadd", key);
}

static void removed(RedisModuleCtx *ctx, RedisModuleKey *set, RedisModuleString *key, RedisModuleString *m) {
    RM_Replicate(ctx, "ZREM", "ss", key, m);
    RM_NotifyKeyspaceEvent(ctx, NOTIFY_ZSET, "zrem", key);
    if (RM_KeyType(set) == RM_KEYTYPE_EMPTY) RM_NotifyKeyspaceEvent(ctx, NOTIFY_GENERIC, "del", key); /* emptied */
}

static int is_zset_or_empty(int type) { return type == RM_KEYTYPE_ZSET || type == RM_KEYTYPE_EMPTY; }

static int same_text(RedisModuleString *x, RedisModuleString *y) {
    size_t xl, yl;
    const char *xp = RM_StringPtrLen(x, &xl), *yp = RM_StringPtrLen(y, &yl);
    return xl == yl && memcmp(xp, yp, xl) == 0;
}

/* Every group names two keys: one key named twice would be opened twice, and a write through one handle
 * would leave the other stale. The client never sends that; a hand-made call is refused whole. */
static int distinct_pairs(RedisModuleString **keys, long long groups) {
    for (long long g = 0; g < groups; g++)
        if (same_text(keys[2 * g], keys[2 * g + 1])) return 0;
    return 1;
}

static int is_text(RedisModuleString *s, const char *want) {
    size_t len;
    const char *p = RM_StringPtrLen(s, &len);
    return len == strlen(want) && memcmp(p, want, len) == 0;
}

static int keys_of(RedisModuleString **argv, int argc, long long *numkeys) {
    return argc >= 2 && RM_StringToLongLong(argv[1], numkeys) == RM_OK && *numkeys >= 0 && *numkeys <= argc - 2;
}

/* Answers the server's question which arguments are keys (a Redis Cluster routes by them, ACLs check them):
 * the numkeys after the command's name, as EVAL declares them. */
static int declare_keys(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    long long numkeys;
    if (keys_of(argv, argc, &numkeys))
        for (int i = 0; i < numkeys; i++) RM_KeyAtPos(ctx, 2 + i);
    return RM_OK;
}

/* The groups' tuple counts, checked against the arguments: the number of tuples, or -1 (and *why set). */
static long long tuples_of(RedisModuleString **a, int na, long long groups, long long singles, const char **why) {
    long long pos = 4, n = 0;
    for (long long g = 0; g < groups; g++) {
        long long count = 1;
        if (g >= singles) {
            if (pos >= na || RM_StringToLongLong(a[pos], &count) != RM_OK || count < 0) {
                *why = "ERR zcluster.write: a group's tuple count is missing or not a count";
                return -1;
            }
            pos++;
        }
        if (count > (na - pos) / 2) {
            *why = "ERR zcluster.write: a group has fewer tuples than its count";
            return -1;
        }
        pos += 2 * count;
        n += count;
    }
    if (pos != na) {
        *why = "ERR zcluster.write: arguments past the last group";
        return -1;
    }
    return n;
}

static int write_command(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    long long numkeys;
    if (RM_IsKeysPositionRequest(ctx)) return declare_keys(ctx, argv, argc);
    if (!keys_of(argv, argc, &numkeys) || argc - 2 - numkeys < 4) return RM_WrongArity(ctx);
    RedisModuleString **keys = argv + 2, **a = argv + 2 + numkeys;
    int na = argc - 2 - (int)numkeys;
    int insert = is_text(a[0], "+");
    if (!insert && !is_text(a[0], "-"))
        return RM_ReplyWithError(ctx, "ERR zcluster.write: op must be + or - (a wait's ! goes to the script)");
    if (!is_text(a[1], "0") || !is_text(a[2], "0"))
        return RM_ReplyWithError(ctx, "ERR zcluster.write: only unbounded calls of declared keys (bound 0, mode 0)");
    long long singles, groups = numkeys / 2;
    if (numkeys % 2) return RM_ReplyWithError(ctx, "ERR zcluster.write: keys come in pairs (K+, K-)");
    if (!distinct_pairs(keys, groups)) return RM_ReplyWithError(ctx, "ERR zcluster.write: a group's K+ and K- are one key");
    if (RM_StringToLongLong(a[3], &singles) != RM_OK || singles < 0 || singles > groups)
        return RM_ReplyWithError(ctx, "ERR zcluster.write: singles must be a count of groups");
    const char *why = NULL;
    long long n = tuples_of(a, na, groups, singles, &why);
    if (n < 0) return RM_ReplyWithError(ctx, why);

    /* Every score parsed before anything is written: a bad one refuses the call whole. */
    double *scores = RM_Alloc((size_t)(n ? n : 1) * sizeof(double));
    char *out = RM_Alloc((size_t)n + sizeof(WRONGTYPE));
    long long pos = 4, t = 0;
    for (long long g = 0; g < groups; g++) {
        long long count = 1;
        if (g >= singles) RM_StringToLongLong(a[pos++], &count);
        for (long long j = 0; j < count; j++, pos += 2, t++) {
            if (RM_StringToDouble(a[pos], &scores[t]) != RM_OK) {
                RM_Free(scores);
                RM_Free(out);
                return RM_ReplyWithError(ctx, "ERR zcluster.write: a score is not a valid float");
            }
        }
    }

    size_t done = 0;
    pos = 4;
    t = 0;
    for (long long g = 0; g < groups; g++) {
        long long count = 1;
        if (g >= singles) RM_StringToLongLong(a[pos++], &count);
        if (count == 0) continue;
        RedisModuleString *kadd = keys[2 * g], *krem = keys[2 * g + 1];
        RedisModuleKey *adds = RM_OpenKey(ctx, kadd, RM_READ | RM_WRITE);
        RedisModuleKey *rems = RM_OpenKey(ctx, krem, RM_READ | RM_WRITE);
        /* The set a tuple is judged by (an insert's K-, a delete's K+) and the one it writes. */
        RedisModuleKey *other = insert ? rems : adds, *own = insert ? adds : rems;
        RedisModuleString *kother = insert ? krem : kadd, *kown = insert ? kadd : krem;
        int stopped = 0;
        for (long long j = 0; j < count; j++, pos += 2, t++) {
            RedisModuleString *stext = a[pos], *m = a[pos + 1];
            double s = scores[t], rec;
            char verdict = '0';
            /* A key of another kind stops the call where the script's command on it would fail, and after
             * the same writes (see lua/write.lua's header: an aggregate's keys fail before any). */
            int to = RM_KeyType(other), wrong_own = !is_zset_or_empty(RM_KeyType(own));
            if (to != RM_KEYTYPE_EMPTY) { /* the other set's record is read (the script's ZSCORE) */
                if (to != RM_KEYTYPE_ZSET) {
                    stopped = 1;
                    break;
                }
                if (RM_ZsetScore(other, m, &rec) == RM_OK) {
                    /* m is recorded in the other set (never in both): that record decides; ties go to the delete */
                    if (insert ? s > rec : s >= rec) {
                        if (insert) { /* the tombstone goes, then K+ takes m (the script's order) */
                            RM_ZsetRem(other, m, NULL);
                            removed(ctx, other, kother, m);
                            if (wrong_own) {
                                stopped = 1;
                                break;
                            }
                            RM_ZsetAdd(own, s, m, NULL);
                            added(ctx, kown, stext, m);
                        } else { /* the tombstone first: K- refuses before K+ loses m */
                            if (wrong_own) {
                                stopped = 1;
                                break;
                            }
                            RM_ZsetAdd(own, s, m, NULL);
                            added(ctx, kown, stext, m);
                            RM_ZsetRem(other, m, NULL);
                            removed(ctx, other, kother, m);
                        }
                        verdict = '1';
                    }
                    out[done++] = verdict;
                    continue;
                }
            }
            if (wrong_own) {
                stopped = 1;
                break;
            }
            int flags = RM_ZADD_GT;
            if (RM_ZsetAdd(own, s, m, &flags) == RM_OK && (flags & (RM_ZADD_ADDED | RM_ZADD_UPDATED))) {
                added(ctx, kown, stext, m);
                verdict = '1';
            }
            out[done++] = verdict;
        }
        RM_CloseKey(adds);
        RM_CloseKey(rems);
        if (stopped) {
            memcpy(out + done, WRONGTYPE, sizeof(WRONGTYPE) - 1);
            done += sizeof(WRONGTYPE) - 1;
            break;
        }
    }
    RM_ReplyWithStringBuffer(ctx, out, done);
    RM_Free(scores);
    RM_Free(out);
    return RM_OK;
}

/* ---- ZCLUSTER.INCR: lua/incr.lua's fenced increments ------------------------------------------------------- */

#define HUGE_DELTA 0x1p970 /* only a delta this large can carry a finite total past the largest double */
static const char FENCE[] = "\0zc|"; /* a counters key's fence fields in its totals hash: FENCE + source */
#define FENCE_LEN 4

/* A source's fence: the position (c, m, j) of its last increment applied to the key and n, how many of its
 * increments the key holds; where it is kept (a hash key and field); the text as stored. */
typedef struct {
    double c, m, j, n;
    RedisModuleKey *at;
    RedisModuleString *kat, *field, *held;
} Fence;

enum { KIND_NEW, KIND_MINE, KIND_OTHER, KIND_BAD };

/* "c:m:j:n" (":n" optional where `optional_n`), digits only, as lua/incr.lua's patterns read it. */
static int parse_fence(RedisModuleString *text, int optional_n, Fence *f) {
    size_t len;
    const char *p = RM_StringPtrLen(text, &len), *end = p + len;
    double *parts[4] = {&f->c, &f->m, &f->j, &f->n};
    for (int i = 0; i < 4; i++) {
        if (i == 3 && optional_n && p == end) {
            f->n = 0;
            return 1;
        }
        if (i > 0) {
            if (p == end || *p != ':') return 0;
            p++;
            if (i == 3 && optional_n && p == end) {
                f->n = 0;
                return 1;
            }
        }
        if (p == end || *p < '0' || *p > '9') return 0;
        double v = 0;
        while (p < end && *p >= '0' && *p <= '9') v = v * 10 + (*p++ - '0');
        *parts[i] = v;
    }
    return p == end;
}

/* lua/incr.lua's fence_in: the source's fence in the K- hash `fences`. */
static int fence_in(RedisModuleKey *totals, RedisModuleKey *fences, RedisModuleString *source, Fence *f) {
    int tf = RM_KeyType(fences);
    if (tf != RM_KEYTYPE_EMPTY && tf != RM_KEYTYPE_HASH) return KIND_OTHER;
    RedisModuleString *got = NULL;
    if (tf == RM_KEYTYPE_HASH) RM_HashGet(fences, RM_HASH_NONE, source, &got, NULL);
    f->c = f->m = f->j = -1;
    f->n = 0;
    if (got == NULL) {
        int held = (tf != RM_KEYTYPE_EMPTY) + (RM_KeyType(totals) != RM_KEYTYPE_EMPTY);
        return held == 0 ? KIND_NEW : held == 2 ? KIND_MINE : KIND_OTHER;
    }
    f->held = got;
    return parse_fence(got, 1, f) ? KIND_MINE : KIND_BAD;
}

/* lua/incr.lua's fence_of: where the source's fence of this key is, and the key's kind as far as it tells. */
static int fence_of(RedisModuleCtx *ctx, int sums, long long ttl, RedisModuleKey *totals, RedisModuleString *ktotals,
                    RedisModuleKey *fences, RedisModuleString *kfences, RedisModuleString *source, Fence *f) {
    f->held = NULL;
    f->c = f->m = f->j = -1;
    f->n = 0;
    if (sums) {
        f->at = fences, f->kat = kfences, f->field = source;
        return fence_in(totals, fences, source, f);
    }
    size_t slen;
    const char *sp = RM_StringPtrLen(source, &slen);
    char *name = RM_Alloc(FENCE_LEN + slen);
    memcpy(name, FENCE, FENCE_LEN);
    memcpy(name + FENCE_LEN, sp, slen);
    RedisModuleString *field = RM_CreateString(ctx, name, FENCE_LEN + slen);
    RM_Free(name);
    f->at = totals, f->kat = ktotals, f->field = field;
    int tt = RM_KeyType(totals);
    if (tt != RM_KEYTYPE_EMPTY && tt != RM_KEYTYPE_HASH) return KIND_OTHER; /* a sorted set: sums or a 2P-set */
    RedisModuleString *got = NULL;
    if (tt == RM_KEYTYPE_HASH) RM_HashGet(totals, RM_HASH_NONE, field, &got, NULL);
    if (got != NULL) {
        f->held = got;
        return parse_fence(got, 0, f) ? KIND_MINE : KIND_BAD;
    }
    if (RM_KeyType(fences) != RM_KEYTYPE_EMPTY) { /* the two-key layout (or a 2P-set's tombstones) */
        f->at = fences, f->kat = kfences, f->field = source;
        return fence_in(totals, fences, source, f);
    }
    if (ttl > 0 && tt == RM_KEYTYPE_EMPTY) return KIND_NEW;
    return KIND_MINE;
}

/* One increment's numbers, parsed once: its position (c, m, j) and its delta, a sum's or a counter's. */
typedef struct {
    double at[3];
    double sum;
    long long count;
} Parsed;

static int below(double c, double m, double j, const Fence *f) {
    return c < f->c || (c == f->c && (m < f->m || (m == f->m && j <= f->j)));
}

static void write_fence(RedisModuleCtx *ctx, Fence *f, RedisModuleString *text) {
    RM_HashSet(f->at, RM_HASH_NONE, f->field, text, NULL);
    RM_Replicate(ctx, "HSET", "sss", f->kat, f->field, text);
    RM_NotifyKeyspaceEvent(ctx, NOTIFY_HASH, "hset", f->kat);
}

/* The fence moved to the last increment applied, with its count. */
static void advance(RedisModuleCtx *ctx, Fence *f) {
    char text[128];
    int len = snprintf(text, sizeof text, "%lld:%lld:%lld:%lld", (long long)f->c, (long long)f->m, (long long)f->j,
                       (long long)f->n);
    write_fence(ctx, f, RM_CreateString(ctx, text, (size_t)len));
}

/* A key made by this call lives `ttl` seconds: the script's own EXPIRE, run as a command, so that the server
 * replicates it as it does any EXPIRE (an absolute time, the same on every replica) and publishes it. */
static int expire(RedisModuleCtx *ctx, RedisModuleString *name, long long ttl) {
    RedisModuleCallReply *reply = RM_Call(ctx, "EXPIRE", "!sl", name, ttl);
    return reply != NULL && RM_CallReplyType(reply) != RM_REPLY_ERROR;
}

static int incr_command(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    long long numkeys;
    if (RM_IsKeysPositionRequest(ctx)) return declare_keys(ctx, argv, argc);
    if (!keys_of(argv, argc, &numkeys) || argc - 2 - numkeys < 2 || numkeys % 2) return RM_WrongArity(ctx);
    RM_AutoMemory(ctx);
    RedisModuleString **keys = argv + 2, **a = argv + 2 + numkeys;
    long long na = argc - 2 - numkeys, groups = numkeys / 2, ttl;
    int sums = is_text(a[0], "s");
    if (!sums && !is_text(a[0], "c")) return RM_ReplyWithError(ctx, "ERR zcluster.incr: kind must be s or c");
    if (RM_StringToLongLong(a[1], &ttl) != RM_OK || ttl < 0)
        return RM_ReplyWithError(ctx, "ERR zcluster.incr: ttl must be a count of seconds");
    if (!distinct_pairs(keys, groups)) return RM_ReplyWithError(ctx, "ERR zcluster.incr: a group's two keys are one key");
    /* The whole call read first, each position and delta parsed once (nothing half-applied): at most one
     * increment per five arguments. */
    Parsed *incs = RM_Alloc((size_t)(na / 5 + 1) * sizeof(Parsed));
    const char *why = NULL;
    long long pos = 2, total = 0;
    for (long long g = 0; g < groups && why == NULL; g++) {
        long long n;
        if (pos + 1 >= na || RM_StringToLongLong(a[pos + 1], &n) != RM_OK || n < 0 || n > (na - pos - 2) / 5) {
            why = "ERR zcluster.incr: a group's count is missing or past the arguments";
            break;
        }
        for (long long i = pos + 2; i < pos + 2 + 5 * n && why == NULL; i += 5) {
            Parsed *p = &incs[total++];
            for (int k = 0; k < 3; k++)
                if (RM_StringToDouble(a[i + k], &p->at[k]) != RM_OK || p->at[k] < 0)
                    why = "ERR zcluster.incr: a position is not three non-negative numbers";
            if (sums ? RM_StringToDouble(a[i + 4], &p->sum) != RM_OK : RM_StringToLongLong(a[i + 4], &p->count) != RM_OK)
                why = "ERR zcluster.incr: a delta is not a number of the kind";
        }
        pos += 2 + 5 * n;
    }
    if (why == NULL && pos != na) why = "ERR zcluster.incr: arguments past the last group";
    if (why != NULL) {
        RM_Free(incs);
        return RM_ReplyWithError(ctx, why);
    }

    char *out = RM_Alloc((size_t)total + 1);
    long long at = 0; /* the next increment's place in incs */
    size_t done = 0;
    pos = 2;
    for (long long g = 0; g < groups; g++) {
        RedisModuleString *ktotals = keys[2 * g], *kfences = keys[2 * g + 1], *source = a[pos];
        long long n;
        RM_StringToLongLong(a[pos + 1], &n);
        long long first = pos + 2, last = pos + 2 + 5 * n;
        pos = last;
        RedisModuleKey *totals = RM_OpenKey(ctx, ktotals, RM_READ | RM_WRITE);
        RedisModuleKey *fences = RM_OpenKey(ctx, kfences, RM_READ | RM_WRITE);
        RedisModuleKey *fences_was = fences; /* where a fence is kept, once the handles are closed */
        Fence f;
        int kind = fence_of(ctx, sums, ttl, totals, ktotals, fences, kfences, source, &f);
        if (kind == KIND_BAD) {
            RM_Free(out);
            RM_Free(incs);
            return RM_ReplyWithError(ctx, "ERR zcluster.incr: a fence that is not c:m:j:n");
        }
        const Parsed *group = incs + at;
        at += n;
        if (kind == KIND_OTHER) {
            for (long long i = 0; i < n; i++) out[done++] = 'k';
            RM_CloseKey(totals);
            RM_CloseKey(fences);
            continue;
        }
        int want = sums ? RM_KEYTYPE_ZSET : RM_KEYTYPE_HASH;
        int moved = 0, failed = 0, fenced = 0, checked = f.at == totals && f.c >= 0;
        size_t start = done;
        for (long long i = first; i < last; i += 5) {
            if (failed) {
                out[done++] = 's';
                continue;
            }
            const Parsed *inc = &group[(i - first) / 5];
            double c = inc->at[0], m = inc->at[1], j = inc->at[2];
            RedisModuleString *member = a[i + 3], *delta = a[i + 4];
            if (below(c, m, j, &f)) {
                if (!checked && !moved) {
                    /* no total's write proved the key's kind yet: a sums key's fences look like a counters key's */
                    checked = 1;
                    int t = RM_KeyType(totals);
                    if (t != RM_KEYTYPE_EMPTY && t != want) {
                        for (long long k = 0; k < n; k++) out[done++] = 'k';
                        break;
                    }
                }
                out[done++] = '0';
                fenced = 1;
                continue;
            }
            int t = RM_KeyType(totals);
            if (t != RM_KEYTYPE_EMPTY && t != want) { /* the other kind of aggregate: nothing of the group applied */
                for (size_t k = start; k < done; k++) out[k] = 'k';
                for (long long k = i; k < last; k += 5) out[done++] = 'k';
                fenced = 0;
                break;
            }
            int ok;
            if (sums) {
                double d = inc->sum, before = 0, after;
                ok = 1;
                if (d >= HUGE_DELTA || d <= -HUGE_DELTA) {
                    RM_ZsetScore(totals, member, &before);
                    after = before + d;
                    ok = !(after == 1.0 / 0.0 || after == -1.0 / 0.0);
                }
                if (ok) ok = RM_ZsetIncrby(totals, d, member, NULL, &after) == RM_OK; /* ERR: NaN */
                if (ok) {
                    RM_Replicate(ctx, "ZINCRBY", "sss", ktotals, delta, member);
                    RM_NotifyKeyspaceEvent(ctx, NOTIFY_ZSET, "zincr", ktotals);
                }
            } else {
                long long d = inc->count, old = 0;
                RedisModuleString *got = NULL;
                if (t == RM_KEYTYPE_HASH) RM_HashGet(totals, RM_HASH_NONE, member, &got, NULL);
                if (got != NULL && RM_StringToLongLong(got, &old) != RM_OK) {
                    /* not this increment's fault: the call fails (as HINCRBY's error fails the script), its
                     * fence first covering what the group applied */
                    if (moved) advance(ctx, &f);
                    RM_Free(out);
                    RM_Free(incs);
                    return RM_ReplyWithError(ctx, "ERR hash value is not an integer");
                }
                ok = !((old < 0 && d < 0 && d < (-9223372036854775807LL - 1) - old) ||
                       (old > 0 && d > 0 && d > 9223372036854775807LL - old));
                if (ok) {
                    RedisModuleString *now = RM_CreateStringFromLongLong(ctx, old + d);
                    RM_HashSet(totals, RM_HASH_NONE, member, now, NULL);
                    RM_Replicate(ctx, "HSET", "sss", ktotals, member, now);
                    RM_NotifyKeyspaceEvent(ctx, NOTIFY_HASH, "hincrby", ktotals);
                }
            }
            if (!ok) {
                out[done++] = 'o';
                failed = 1;
                continue;
            }
            out[done++] = '1';
            f.c = c, f.m = m, f.j = j, f.n += 1;
            moved = 1;
        }
        if (moved) {
            advance(ctx, &f);
            if (kind == KIND_NEW && ttl > 0) {
                /* the keys' handles closed first: EXPIRE opens them itself */
                RM_CloseKey(totals);
                RM_CloseKey(fences);
                totals = fences = NULL;
                if (!expire(ctx, ktotals, ttl) || (f.at == fences_was && !expire(ctx, kfences, ttl))) {
                    RM_Free(out);
                    RM_Free(incs);
                    return RM_ReplyWithError(ctx, "ERR zcluster.incr: EXPIRE refused the time to live");
                }
            }
        } else if (fenced) {
            /* applied before, maybe by a call whose WAIT fell short: the fence written again as it is (see
             * lua/incr.lua), so that this call's WAIT covers what it found applied */
            write_fence(ctx, &f, f.held);
        }
        if (totals != NULL) RM_CloseKey(totals); /* one handle per key at a time: another group's may write it */
        if (fences != NULL) RM_CloseKey(fences);
    }
    RM_ReplyWithStringBuffer(ctx, out, done);
    RM_Free(out);
    RM_Free(incs);
    return RM_OK;
}

static int version_command(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    if (argc != 1) return RM_WrongArity(ctx);
    return RM_ReplyWithLongLong(ctx, PROTOCOL);
}

static int on_load(RedisModuleCtx *ctx) {
    if (zc_bind_api(ctx) != RM_OK) return RM_ERR;
    if (RM_GetServerVersion() < 0x00070000) return RM_ERR; /* before 7.0, a sorted set's add ignores GT */
    if (RM_IsModuleNameBusy("zcluster")) return RM_ERR;
    RM_SetModuleAttribs(ctx, "zcluster", 1, RM_APIVER_1);
    if (RM_CreateCommand(ctx, "zcluster.version", version_command, "readonly fast", 0, 0, 0) != RM_OK) return RM_ERR;
    if (RM_CreateCommand(ctx, "zcluster.incr", incr_command, "write deny-oom getkeys-api", 0, 0, 0) != RM_OK)
        return RM_ERR;
    return RM_CreateCommand(ctx, "zcluster.write", write_command, "write deny-oom getkeys-api", 0, 0, 0);
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    return on_load(ctx);
}

int ValkeyModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    return on_load(ctx);
}
