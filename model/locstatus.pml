/*
 * locstatus.pml: the pause / resume / schedule / settle / acknowledge / lease / tombstone
 * protocol of locstatus, checked with spin.
 *
 * model/README.md maps every process and action below to the function of the code that does
 * it, says what is abstracted away, and which properties hold for which bounds; model/check.sh
 * runs the checks. Each seeded bug of the hostile review is a -D flag (BUG_*) and each
 * discrepancy the model found in the code is one too (FINDING_*): with it the model fails, and
 * the counter-example is kept in model/trails/.
 *
 * Shape: every action is one `atomic` step guarded by what enables it, the way the code's
 * round trips are (a read, a compare-and-set, an acknowledgement). Two abstractions keep the
 * state space small, each argued in model/README.md:
 * - time is backend time in ticks and every deadline is kept *relative* ("deadline - now"):
 *   a tick lowers them all, so the clock runs for ever in a finite state space; it only ticks
 *   while some deadline is pending;
 * - a version is only ever compared with the current one, so a process keeps, instead of the
 *   version it read, a bit "still current" that every write to that record clears.
 */

/* ---------------------------------------------------------------- bounds (-D to change) */
#ifndef NW
#define NW 2            /* workers (agents): 2 or 3 */
#endif
#ifndef NL
#define NL 1            /* locations: 1 or 2 */
#endif
#ifndef NOPR
#define NOPR 2          /* operators */
#endif
#ifndef NOPS
#define NOPS 1          /* operations per operator */
#endif
#ifndef NFIRE
#define NFIRE 1         /* processes firing due resumes per location */
#endif
#ifndef NAMB
#define NAMB 1          /* operator writes whose reply is lost (ambiguous commits), in all */
#endif
#ifndef NFAIL
#define NFAIL 1         /* handler failures, in all */
#endif
#ifndef NFAULT
#define NFAULT 1        /* worker faults, in all: crash, freeze, lost session (partition) */
#endif
#ifndef INIT_GEN
#define INIT_GEN 0      /* generation of the initial record, settled: odd paused, even running
                           (a record paused and resumed before any worker started) */
#endif
#ifndef DOWN
#define DOWN 0          /* workers not started at first (they may join: a fault) */
#endif
#ifndef OPS_SET
#define OPS_SET 0       /* operations: 0: pause resume schedule cancel (both operators);
                           1: those and remove add (both); 3: operator 0 the first four,
                           operator 1 (a location sync job) remove and add */
#endif

/* ---------------------------------------------------------------- time, in ticks */
#define U       1       /* bound on |a process's estimate of backend time - backend time| */
#define LEASE   4       /* lease_seconds */
#ifdef BUG_FENCE_MARGIN
#define MARGIN  U       /* seeded: the fence margin is not above the uncertainty */
#else
#define MARGIN  (U+1)   /* fence margin: always more than the uncertainty bound */
#endif
#define HB      1       /* a heartbeat is sent when the fence deadline is this close */
#define TTL     2       /* tombstone ttl */
#define DELAY   2       /* resume(at=timedelta(DELAY)) */
#define SKEW    (LEASE+U+1) /* a wall clock this far ahead sees every lease past */

/* Time readings. Each process estimates backend time within U of it and acts on a deadline only
 * when it is past beyond doubt (TimeSource.is_past: estimate - U >= deadline). The model takes
 * every reading at the end of its bound that acts soonest: a deadline is past when
 * deadline - now <= 0 by the backend's own clock, and a stamp "now + d" is written as d - U
 * from now (the soonest a lease, a schedule or a ttl can end). A reading at the other end only
 * turns an action into a no-op, the same global state as that process not having run yet,
 * which the interleavings already hold. Seeded variants judge on a wall clock SKEW ahead. */
#define PAST(left, thr) ((left) <= (thr))
#define BACKEND 0

/* ---------------------------------------------------------------- states, events */
#define RUNNING  0
#define PAUSING  1
#define PAUSED   2
#define RESUMING 3
#define DPAUSED(s) ((s) == PAUSING || (s) == PAUSED)
#define TRANS(s)   ((s) == PAUSING || (s) == RESUMING)
#define SETTLED(s) ((s) == PAUSING -> PAUSED : RUNNING)

mtype = { m_pause, m_resume, m_schedule, m_cancel, m_remove, m_add,
          m_running, m_pausing, m_paused, m_resuming, m_on_pause, m_on_resume };
#define EVN(ev) (ev == E_PAUSE -> m_pause : (ev == E_RESUME -> m_resume : (ev == E_SCHED -> m_schedule : \
                 (ev == E_CANCEL -> m_cancel : (ev == E_REMOVE -> m_remove : m_add)))))
#define STN(s) (s == RUNNING -> m_running : (s == PAUSING -> m_pausing : (s == PAUSED -> m_paused : m_resuming)))
#define E_PAUSE  1
#define E_RESUME 2
#define E_SCHED  3
#define E_CANCEL 4
#define E_REMOVE 5
#define E_ADD    6

#define IX(w, l) ((w) * NL + (l))
#define NWL (NW * NL)
#define NOP (NOPR * NOPS * NL)  /* operator writes: (operator, operation, location) */

/* ---------------------------------------------------------------- the backend */
/* One record per location, versioned; compare-and-set on the version (which tells a record
 * deleted and created again apart: SQLite's incarnations table, ZooKeeper's history counter). */
bit   rex[NL];          /* the record exists */
bit   rdel[NL];         /* tombstone: deleted_at is set */
byte  rinc[NL];         /* incarnation: lives of the record so far */
byte  rst[NL];          /* state of the (one) service */
byte  rgen[NL];         /* generation */
bit   rsch[NL];         /* a resume is scheduled (resume_at is set) */
byte  rres[NL];         /* resume_at - now (0: due) */
byte  rtomb[NL];        /* id of the removal (tombstone_generation(deleted_at)), 0: none */
byte  rttl[NL];         /* deleted_at + ttl - now (0: old enough) */
#ifdef BUG_ACTOR
byte  ractor[NL];       /* the status's actor (carried over by schedule, cancel, settle) */
#endif
#ifdef BUG_ACK_NO_INCARNATION
byte  rcnt[NL];         /* ZooKeeper's znode version: restarts at a re-creation */
#endif

/* Worker registrations (leases) and acknowledgements. */
bit   reg[NW];          /* registered */
byte  age[NW];          /* ticks since its last successful renewal (see AGE_MAX) */
byte  ack[NWL];         /* acknowledged generation + 1 (0: none) */
byte  ackt[NWL];        /* acknowledged removal id */

/* ---------------------------------------------------------------- the workers (agents) */
bit   up[NW];           /* the process runs (not crashed) */
bit   frozen[NW];       /* SIGSTOPped: takes no step, its consumers do nothing */
bit   part[NW];         /* its heartbeats fail (network, a lost session, oversize registration) */
bit   fenced[NW];       /* self-fenced: stops its consumers, acknowledges nothing */
byte  fails;            /* handler failures left, in all */
#ifdef BUG_BASEEXC
bit   adead[NW];        /* seeded: the apply thread died of a handler's BaseException */
#endif
/* what each worker applied, per location */
byte  applied[NWL];     /* generation + 1 applied and acknowledged (Agent._applied) */
byte  handled[NWL];     /* generation + 1 whose handler succeeded, ack still due (_handled) */
byte  appt[NWL];        /* removal id whose on_remove ran (and was acknowledged) */
byte  linc[NWL];        /* incarnation of the record it applied */
bit   running[NWL];     /* its consumers run (on_resume started, on_pause not finished) */
bit   holds[NWL];       /* it applied the location: on_remove is owed if the location goes */
/* the handler in flight, per worker and location (per-location handler execution) */
byte  ph[NWL];          /* phase: */
#define IDLE     0
#define HANDLING 1      /* on_pause / on_resume running */
#define REMOVING 2      /* on_remove running */
byte  hg[NWL];          /* generation being applied */
bit   hdes[NWL];        /* ... its desired state is paused */
bit   hfr[NWL];         /* ... the version it was read at is still the current one */
byte  ht[NWL];          /* removal id being applied (0: the location is gone) */
#ifdef BUG_ACK_NO_INCARNATION
byte  hcnt[NWL];        /* ... the znode version it was read at */
#endif

/* ---------------------------------------------------------------- writers' versions */
bit   opfr[NOPR];       /* the version operator o read is still current */
byte  oloc[NOPR];       /* ... of this location */
bit   ffr[NFIRE * NL];  /* the version firer f read is still current */
bit   pfr[NL];          /* the version the purge read is still current */

/* every write to location l makes each version read of it stale */
inline bump(l, j) {
    for (j : 0 .. NW - 1) { hfr[IX(j, l)] = 0 }
    for (j : 0 .. NOPR - 1) { if :: oloc[j] == l -> opfr[j] = 0 :: else -> skip fi }
    for (j : 0 .. NFIRE - 1) { ffr[j * NL + l] = 0 }
    pfr[l] = 0;
#ifdef BUG_LANDED_WINDOW
    for (j : 0 .. NOP - 1) { if :: j % NL == l -> opnew[j] = 0 :: else -> skip fi }
#endif
#ifdef BUG_ACK_NO_INCARNATION
    rcnt[l]++;
#endif
    j = 0
}

/* ---------------------------------------------------------------- ghosts (for properties) */
/* A property check: on a violation the replay of its trail prints which property failed. */
#define CHECK(c, what) if :: !(c) -> printf(what); assert(c) :: else -> skip fi

byte  amb = NAMB;       /* ambiguous commits left */
bit   opl[NOP];         /* operator write landed in the current life of the record */
#ifdef BUG_LANDED_WINDOW
bit   opnew[NOP];       /* ... and it is the newest write */
#endif
bit   sched_ok[NL];     /* the current schedule was set after the latest pause */
bit   sfired[NL];       /* the current schedule fired */
byte  ntomb;            /* removal ids */

/* history: operator write `op` lands on location l */
inline land(op) {
    CHECK(!opl[op], "VIOLATED: an operation applied twice\n");  /* each op_id once in the version chain */
    opl[op] = 1
}

/* history row actor: the event's own (the FSM as fixed); seeded: the status's, carried over */
#ifdef BUG_ACTOR
#define ROW_ACTOR(l, a, desired) (desired -> a : (a != 0 -> a : ractor[l]))
#define CHECK_ROW(l, a, desired) CHECK(ROW_ACTOR(l, a, desired) == a, "VIOLATED: a history row names another actor\n"); \
    if :: desired || a != 0 -> ractor[l] = a :: else -> skip fi
#else
#define CHECK_ROW(l, a, desired) skip
#endif

/* ---------------------------------------------------------------- leases */
/* A renewal stamps lease_expires_at = now + LEASE (so LEASE - U from now, see above); the worker
 * fences by its own monotonic clock LEASE - MARGIN after it sent that renewal. Both are kept as
 * one age: ticks since the last renewal that succeeded (a renewal whose reply was lost only
 * lengthens the backend's view of the lease; the model leaves it out). A heartbeating worker
 * renews every HB ticks, so its age only matters from the moment it stops heartbeating (a
 * fault): the model keeps it at 0 until then, and the fault starts it anywhere in 0 .. HB. */
#define AGE_MAX       (LEASE - U)
#define LEASE_LEFT(w) (LEASE - U - age[w])
#define FENCE_DUE(w)  (age[w] >= LEASE - MARGIN)
#define BEAT_DUE(w)   (age[w] >= LEASE - MARGIN - HB)
/* alive: registered and its lease not past beyond doubt */
#define LIVE(w, thr)  (reg[w] && !PAST(LEASE_LEFT(w), thr))
#define EXPIRED(w)    (reg[w] && PAST(LEASE_LEFT(w), BACKEND))
#define RUN(w)        (up[w] && !frozen[w])

#if NW == 2
#define ACKED(l, thr) ((!LIVE(0, thr) || ack[IX(0, l)] > rgen[l]) && \
                       (!LIVE(1, thr) || ack[IX(1, l)] > rgen[l]))
#define NONE_LIVE(thr) (!LIVE(0, thr) && !LIVE(1, thr))
#define TACKED(l)     ((!LIVE(0, BACKEND) || ackt[IX(0, l)] == rtomb[l]) && \
                       (!LIVE(1, BACKEND) || ackt[IX(1, l)] == rtomb[l]))
#define ANY_EXPIRED   (EXPIRED(0) || EXPIRED(1))
#elif NW == 3
#define ACKED(l, thr) ((!LIVE(0, thr) || ack[IX(0, l)] > rgen[l]) && \
                       (!LIVE(1, thr) || ack[IX(1, l)] > rgen[l]) && \
                       (!LIVE(2, thr) || ack[IX(2, l)] > rgen[l]))
#define NONE_LIVE(thr) (!LIVE(0, thr) && !LIVE(1, thr) && !LIVE(2, thr))
#define TACKED(l)     ((!LIVE(0, BACKEND) || ackt[IX(0, l)] == rtomb[l]) && \
                       (!LIVE(1, BACKEND) || ackt[IX(1, l)] == rtomb[l]) && \
                       (!LIVE(2, BACKEND) || ackt[IX(2, l)] == rtomb[l]))
#define ANY_EXPIRED   (EXPIRED(0) || EXPIRED(1) || EXPIRED(2))
#endif

/* the clock a decision is judged on: the backend's (seeded: operator 0's or firer 0's own) */
#ifdef BUG_SKEW_SETTLE
#define SETTLE_CLOCK(me) (me == 0 -> SKEW : BACKEND)
#else
#define SETTLE_CLOCK(me) BACKEND
#endif
#ifdef BUG_SKEW_RESUME
#define FIRE_CLOCK(me) (me == 0 -> SKEW : BACKEND)
#else
#define FIRE_CLOCK(me) BACKEND
#endif

/* ---------------------------------------------------------------- settle, fire, purge, expire */
/* settle rule: pausing/resuming, and every live worker acknowledged the generation */
#define CAN_SETTLE(l, thr) (rex[l] && !rdel[l] && TRANS(rst[l]) && ACKED(l, thr))
/* resume_due: a schedule whose time is past beyond doubt */
#define CAN_FIRE(l, thr) (rex[l] && !rdel[l] && rsch[l] && DPAUSED(rst[l]) && PAST(rres[l], thr))
/* a tombstone every live worker acknowledged, or older than the ttl */
#define CAN_PURGE(l) (rex[l] && rdel[l] && (PAST(rttl[l], BACKEND) || TACKED(l)))

/* Manager.settle: read the record, the workers and their acks; plan; compare-and-set. One step:
 * a change between its reads and its write fails the compare-and-set or only adds an
 * acknowledgement, and a worker coming back meanwhile reads the record it settles. */
inline settle_write(l, j) {
    CHECK_ROW(l, 0, 0);
    rst[l] = SETTLED(rst[l]);
    printf("MSC: settle L%d -> %e gen %d\n", l, (rst[l] == PAUSED -> m_paused : m_running), rgen[l]);
    bump(l, j)
}

/* The sidecar's Reconciler, `check --repair`, an agent's _try_settle / _settle_transitional, a
 * `wait=` loop: any number of processes call Manager.settle. */
proctype Settle(byte l) {
    byte j;
end:
    do
    :: atomic { CAN_SETTLE(l, BACKEND) -> settle_write(l, j) }
    od
}

/* Manager.fire_due_resumes (reconciler, check --repair, agents): resume_due, guarded by the
 * compare-and-set of the record it read. */
proctype Fire(byte me; byte l) {
    byte j; bit unw;
end:
    do
    :: atomic {
           CAN_FIRE(l, FIRE_CLOCK(me)) -> ffr[me * NL + l] = 1;
           printf("MSC: firer %d reads L%d: resume due\n", me, l);
#ifdef FINDING_ONE_WRITE_SETTLE
           unw = NONE_LIVE(FIRE_CLOCK(me));
#endif
           skip
       };
       atomic {
           if
#ifdef BUG_FIRE_NO_CAS
           :: rex[l] && !rdel[l] && DPAUSED(rst[l]) ->  /* seeded: no version check */
#else
           :: rex[l] && ffr[me * NL + l] ->
#endif
               CHECK(rres[l] == 0, "VIOLATED: a resume fired before its time\n");
               CHECK(!sfired[l], "VIOLATED: a resume fired twice\n");
               CHECK(sched_ok[l], "VIOLATED: a resume reverted a later pause\n");
               CHECK_ROW(l, 8 + me, 0);
               sfired[l] = 1;
               rst[l] = RESUMING; rgen[l]++; rsch[l] = 0; rres[l] = 0;
               printf("MSC: firer %d fires the resume of L%d: resuming gen %d\n", me, l, rgen[l]);
#ifdef FINDING_ONE_WRITE_SETTLE
               if :: unw -> rst[l] = RUNNING :: else -> skip fi;   /* as the code was */
               bump(l, j)
#else
               bump(l, j);
               unw = 1     /* its write is the current record (the bit below): settle next */
#endif
           :: else -> printf("MSC: firer %d: conflict\n", me)  /* read again */
           fi;
#ifdef FINDING_ONE_WRITE_SETTLE
           ffr[me * NL + l] = 0; unw = 0
#else
           ffr[me * NL + l] = unw  /* still current: nothing wrote since its own write */
#endif
       };
#ifndef FINDING_ONE_WRITE_SETTLE
       /* Manager._settle_unwatched: the workers read after its write, which is still current */
       atomic {
           if
           :: unw && ffr[me * NL + l] && NONE_LIVE(FIRE_CLOCK(me)) -> settle_write(l, j)
           :: else -> skip
           fi;
           ffr[me * NL + l] = 0; unw = 0
       }
#endif
       skip
    od
}

/* check --repair: Manager.purge_location -> Backend.delete (record, history and acks) at the
 * version read, of a tombstone every live worker acknowledged or older than the ttl. */
proctype Purge(byte l) {
    byte j;
end:
    do
    :: atomic { CAN_PURGE(l) -> pfr[l] = 1; printf("MSC: check reads tombstone L%d: ready\n", l) };
       atomic {
           if
           :: rex[l] && pfr[l] ->
               printf("MSC: check purges L%d\n", l);
               bump(l, j);
               rex[l] = 0; rdel[l] = 0; rst[l] = 0; rgen[l] = 0; rsch[l] = 0; rres[l] = 0;
               rtomb[l] = 0; rttl[l] = 0; sched_ok[l] = 0; sfired[l] = 0;
               for (j : 0 .. NW - 1) { ack[IX(j, l)] = 0; ackt[IX(j, l)] = 0 }
               for (j : 0 .. NOP - 1) { if :: j % NL == l -> opl[j] = 0 :: else -> skip fi }
               j = 0
           :: else -> skip
           fi;
           pfr[l] = 0
       }
    od
}

/* Expired registrations are dropped with their acks: check --repair (Backend.remove_worker),
 * or a ZooKeeper session expiring on the server. */
inline drop_worker(w, l) {
    printf("MSC: check drops the registration of w%d (and its acks)\n", w);
    reg[w] = 0;
    for (l : 0 .. NL - 1) { ack[IX(w, l)] = 0; ackt[IX(w, l)] = 0 }
    l = 0
}
proctype Expire() {
    byte w; byte l; byte mask;
end:
    do
#ifdef FINDING_REMOVE_RACE
    /* as the code was (finding 2): re-read the workers, then remove_worker unconditionally */
    :: atomic {
           ANY_EXPIRED ->
           for (w : 0 .. NW - 1) { if :: EXPIRED(w) -> mask = mask | (1 << w) :: else -> skip fi }
           printf("MSC: check reads the workers: expired mask %d\n", mask);
           w = 0
       };
       atomic {
           for (w : 0 .. NW - 1) { if :: mask & (1 << w) -> drop_worker(w, l) :: else -> skip fi }
           mask = 0; w = 0
       }
#else
    /* check.repair.Repairer._remove_worker: Backend.remove_worker(if_expires=), dropped only while
     * still the registration seen expired: one conditional write (or the session's expiry) */
    :: atomic {
           ANY_EXPIRED ->
           for (w : 0 .. NW - 1) { if :: EXPIRED(w) -> drop_worker(w, l) :: else -> skip fi }
           w = 0
       }
#endif
    od
}

/* ---------------------------------------------------------------- operators */
/* Manager.pause / resume / resume(at=) / cancel_scheduled_resume / remove_location /
 * add_location (sync_locations), each through Manager._write: read, plan, compare-and-set,
 * re-read on a conflict, resolve an ambiguous commit by the op_id at the version it would have
 * produced. A bulk operation ("all") is one such write per location. */

/* the event changes something on the current record (else: no write, success; or 409) */
#define CHANGES(ev, l) ( \
    (ev == E_PAUSE && (!DPAUSED(rst[l]) || rsch[l])) || \
    (ev == E_RESUME && DPAUSED(rst[l])) || \
    (ev == E_SCHED && DPAUSED(rst[l])) || \
    (ev == E_CANCEL && rsch[l]) || \
    (ev == E_REMOVE && !rdel[l]) || \
    (ev == E_ADD && rdel[l]))
/* the write leaves the service pausing/resuming (a flip, or a schedule change meanwhile) */
#define MAKES_TRANS(ev, l) ((ev == E_PAUSE && !DPAUSED(rst[l])) || \
                            (ev == E_RESUME && DPAUSED(rst[l])) || \
                            (ev <= E_CANCEL && TRANS(rst[l])))
/* Manager._landed: the history entry at the version the write would have produced holds the
 * op_id (seeded: looked for among the newest writes only, here the newest one) */
#ifdef BUG_LANDED_WINDOW
#define LANDED(op) (opl[op] && opnew[op])
#else
#define LANDED(op) (opl[op])
#endif

inline apply_event(ev, l, actor, unw, j) {
    if
    :: ev == E_PAUSE ->
        CHECK_ROW(l, actor, 1);
        if :: !DPAUSED(rst[l]) -> rst[l] = PAUSING; rgen[l]++ :: else -> skip fi;
        rsch[l] = 0; rres[l] = 0; sched_ok[l] = 0
    :: ev == E_RESUME ->
        CHECK_ROW(l, actor, 1);
        rst[l] = RESUMING; rgen[l]++; rsch[l] = 0; rres[l] = 0
    :: ev == E_SCHED ->
        CHECK_ROW(l, actor, 0);
        rsch[l] = 1; rres[l] = DELAY - U; sched_ok[l] = 1; sfired[l] = 0
    :: ev == E_CANCEL ->
        CHECK_ROW(l, actor, 0);
        rsch[l] = 0; rres[l] = 0
    :: ev == E_REMOVE ->
        rdel[l] = 1; ntomb++; rtomb[l] = ntomb; rttl[l] = TTL - U
    :: ev == E_ADD ->
        rdel[l] = 0; rtomb[l] = 0; rttl[l] = 0
    fi;
#ifdef FINDING_ONE_WRITE_SETTLE
    /* as the code was (finding 1): no live worker seen at plan time: settled in the same write */
    if :: unw && TRANS(rst[l]) -> rst[l] = SETTLED(rst[l]) :: else -> skip fi;
#endif
    bump(l, j)
}

#if OPS_SET == 0
#define OPS_STATUS(me) true
#define OPS_SYNC(me) false
#elif OPS_SET == 1
#define OPS_STATUS(me) true
#define OPS_SYNC(me) true
#else
#define OPS_STATUS(me) (me == 0)
#define OPS_SYNC(me) (me != 0)
#endif
/* Ambiguous commits happen to operator 0: the operators differ only in their actor's name, so
 * one that happens to operator 1 is the same run with the names swapped. */
#define MAY_LOSE(me) (amb > 0 && me == 0)

proctype Operator(byte me) {
    byte k; byte ev; byte l; byte op; byte j;
    bit ambig; bit unw; bit bulk; byte actor;
    actor = (me == 0 -> 1 : 0);     /* operator 0 names itself, operator 1 is anonymous */
    for (k : 0 .. NOPS - 1) {
        if
        :: OPS_STATUS(me) -> ev = E_PAUSE
        :: OPS_STATUS(me) -> ev = E_RESUME
        :: OPS_STATUS(me) -> ev = E_SCHED
        :: OPS_STATUS(me) -> ev = E_CANCEL
        :: OPS_SYNC(me) -> ev = E_REMOVE
        :: OPS_SYNC(me) -> ev = E_ADD
        fi;
        l = 0;
#if NL > 1
        if :: bulk = 1 :: select (l : 0 .. NL - 1) fi;
#endif
again:
        op = (me * NOPS + k) * NL + l;
        oloc[me] = l;
rd:     atomic {
            if
            :: ambig && LANDED(op) ->                   /* it landed: the call returns it */
                printf("MSC: op%d finds its op_id: it landed\n", me); goto done
            :: else -> ambig = 0
            fi;
            if
            :: !rex[l] && ev == E_ADD ->
                /* Backend.create: a new incarnation, running, generation 0 */
                rex[l] = 1; rinc[l]++; rst[l] = RUNNING; rgen[l] = 0; bump(l, j);
                printf("MSC: op%d creates L%d again (incarnation %d)\n", me, l, rinc[l]);
#ifdef BUG_ACK_NO_INCARNATION
                rcnt[l] = 1;
#endif
                goto done
            :: !rex[l] -> goto done                                         /* NotFound */
            :: rex[l] && rdel[l] && ev != E_ADD && ev != E_REMOVE -> goto done   /* NotFound */
            :: rex[l] && !CHANGES(ev, l) -> goto done       /* no-op, or 409 for a schedule */
            :: else -> skip
            fi;
            opfr[me] = 1;
            printf("MSC: op%d reads L%d for %e (state %e gen %d)\n", me, l, EVN(ev), STN(rst[l]), rgen[l]);
#ifdef FINDING_ONE_WRITE_SETTLE
            /* as the code was (finding 1): no live worker applies it (judged on this caller's
             * time), settled in the write below */
            unw = MAKES_TRANS(ev, l) && NONE_LIVE(SETTLE_CLOCK(me))
#else
            skip
#endif
        }
        atomic {
            if
            :: rex[l] && opfr[me] ->
                opfr[me] = 0;
                if
                :: land(op); apply_event(ev, l, actor, unw, j);
                   printf("MSC: op%d writes %e: L%d %e gen %d\n", me, EVN(ev), l, STN(rst[l]), rgen[l]);
#ifndef FINDING_ONE_WRITE_SETTLE
                   /* it left the service pausing/resuming, and its write is the current record */
                   unw = (ev <= E_CANCEL && TRANS(rst[l])); opfr[me] = unw
#else
                   skip
#endif
                :: MAY_LOSE(me) ->                  /* it landed, its reply was lost */
                    amb--; land(op); apply_event(ev, l, actor, unw, j);
                    printf("MSC: op%d writes %e: L%d %e gen %d; the reply is lost\n", me, EVN(ev), l, STN(rst[l]), rgen[l]);
#ifdef BUG_LANDED_WINDOW
                    opnew[op] = 1;
#endif
                    ambig = 1; unw = 0; goto rd
                :: MAY_LOSE(me) ->                  /* lost before it landed */
                    amb--; ambig = 1; unw = 0;
                    printf("MSC: op%d: the write is lost before it lands\n", me);
                    goto rd
                fi
            :: else -> unw = 0; printf("MSC: op%d: conflict, re-read\n", me); goto rd
            fi
        }
#ifndef FINDING_ONE_WRITE_SETTLE
        /* Manager._settle_unwatched: the workers read after the write; none live applies it,
         * and the write is still the current record (the compare-and-set of the settle) */
        atomic {
            if :: unw && opfr[me] && NONE_LIVE(SETTLE_CLOCK(me)) -> settle_write(l, j) :: else -> skip fi;
            unw = 0; opfr[me] = 0
        }
#endif
done:
        ambig = 0; unw = 0;
#if NL > 1
        if :: bulk && l < NL - 1 -> l++; goto again :: else -> bulk = 0 fi;
#endif
        ev = 0; l = 0; op = 0
    }
}

/* ---------------------------------------------------------------- the agent */
/* coming back needs the fence's pause handlers, and the on_remove of a location found gone, to
 * have finished (seeded: not waited for). FINDING_FENCE_REMOVE: as the code was, a location
 * found gone counted as stopped once its on_remove was under way (queued, in the code). */
#ifdef FINDING_FENCE_REMOVE
#define STOPPED(i) (ph[i] != HANDLING && ((ph[i] == REMOVING && ht[i] == 0) || \
                                          (!running[i] && ph[i] != REMOVING)))
#else
#define STOPPED(i) (!running[i] && ph[i] != HANDLING && ph[i] != REMOVING)
#endif
#if NL == 1
#define FENCE_DONE(w) (STOPPED(IX(w, 0)))
#else
#define FENCE_DONE(w) (STOPPED(IX(w, 0)) && STOPPED(IX(w, 1)))
#endif
#ifdef BUG_EARLY_UNFENCE
#define UNFENCE_READY(w)
#else
#define UNFENCE_READY(w) && FENCE_DONE(w)
#endif
#ifdef BUG_BASEEXC
#define NOT_DEAD(w) && !adead[w]
#else
#define NOT_DEAD(w)
#endif

/* Heartbeat thread and lease keeper (Agent._beat): renew the lease; self-fence past the
 * monotonic deadline; once the lease is back, come back: apply and acknowledge everything
 * again on a fresh read. */
proctype Heartbeat(byte w) {
    byte l;
end:
    do
    :: atomic { RUN(w) && !part[w] && BEAT_DUE(w) -> reg[w] = 1; age[w] = 0;
                printf("MSC: w%d renews its lease\n", w) }
#ifndef BUG_NO_FENCE
    :: atomic { RUN(w) && !fenced[w] && FENCE_DUE(w) -> fenced[w] = 1;
                printf("MSC: w%d self-fences\n", w) }
#endif
    :: atomic {
        RUN(w) && fenced[w] && !FENCE_DUE(w) UNFENCE_READY(w) ->
        fenced[w] = 0;
        printf("MSC: w%d comes back: applies everything again\n", w);
        for (l : 0 .. NL - 1) {
            applied[IX(w, l)] = 0; handled[IX(w, l)] = 0
        }
        l = 0
       }
    od
}

/* The worker drops a location it holds no record of (Agent._forget) */
inline forget(i) {
    CHECK(!holds[i], "VIOLATED: a location dropped without on_remove\n");
    applied[i] = 0; handled[i] = 0; appt[i] = 0; linc[i] = 0
}

/* the location it applied is gone: purged, or purged and created again (a new incarnation:
 * what it applied of the old one says nothing of the new); FINDING: only when missing */
#ifdef FINDING_STALE_APPLIED
#define GONE(i, l) (holds[i] && !rex[l])
#else
#define GONE(i, l) (holds[i] && (!rex[l] || linc[i] != rinc[l]))
#endif
#define TOMB_DUE(i, l)  (rex[l] && rdel[l] && appt[i] != rtomb[l])
#define APPLY_DUE(i, l) (rex[l] && !rdel[l] && applied[i] != rgen[l] + 1)

/* acknowledge with if_version = the version whose state was applied; a VersionConflict means
 * the record is read again (a newer generation runs the handler first) */
inline acknowledge(w, l, i) {
    if
#ifdef BUG_ACK_NO_INCARNATION
    :: rex[l] && rcnt[l] == hcnt[i] ->      /* seeded: the znode version only */
#else
    :: rex[l] && hfr[i] ->
#endif
        ack[i] = hg[i] + 1; applied[i] = hg[i] + 1; handled[i] = 0;
        printf("MSC: w%d acknowledges L%d gen %d\n", w, l, hg[i])
    :: else -> printf("MSC: w%d: ack of L%d refused (version moved)\n", w, l)
    fi;
    ph[i] = IDLE; hg[i] = 0; hdes[i] = 0; hfr[i] = 0
}

/* Watch and apply threads for one location (Agent._watch_loop, _refresh, _resync, _store;
 * Agent._apply, _run_handlers, _acknowledge, _apply_removal; per-location handler execution).
 * A hint, or the periodic resync, makes the agent read a record that changed; the read and the
 * pick-up of the work it makes due are one step (a hint lost, merged or late only delays that
 * step; a hint's record older than the local copy is ignored by its version). */
proctype Apply(byte w; byte l) {
    byte i = IX(w, l);
end:
    do
    /* fenced: its pause handlers run (urgent: the fence margin covers them) */
    :: atomic { RUN(w) && fenced[w] && running[i] && ph[i] != HANDLING && ph[i] != REMOVING
                -> running[i] = 0; printf("MSC: w%d stops L%d (fenced)\n", w, l) }
    /* the location went while applied (a resync, or a re-read, finds it gone; fenced too:
     * the watch thread reads while fenced, and on_remove stops what ran there) */
    :: atomic {
        RUN(w) && ph[i] == IDLE NOT_DEAD(w) && GONE(i, l) ->
        printf("MSC: w%d finds L%d gone\n", w, l);
#ifdef BUG_ON_REMOVE
        forget(i)                           /* seeded: dropped without on_remove */
#else
        ph[i] = REMOVING; ht[i] = 0         /* on_remove first */
#endif
       }
    /* a tombstone: on_remove */
    :: atomic {
        RUN(w) && !fenced[w] && ph[i] == IDLE NOT_DEAD(w) && !GONE(i, l) && TOMB_DUE(i, l) ->
        ph[i] = REMOVING; ht[i] = rtomb[l];
        printf("MSC: w%d reads the tombstone of L%d: on_remove starts\n", w, l)
       }
    /* a generation not applied yet: on_pause / on_resume (or only the acknowledgement) */
    :: atomic {
        RUN(w) && !fenced[w] && ph[i] == IDLE NOT_DEAD(w) && !GONE(i, l) && APPLY_DUE(i, l) ->
        hg[i] = rgen[l]; hdes[i] = DPAUSED(rst[l]); hfr[i] = 1; linc[i] = rinc[l];
#ifdef BUG_ACK_NO_INCARNATION
        hcnt[i] = rcnt[l];
#endif
        if
        :: handled[i] == rgen[l] + 1 -> acknowledge(w, l, i)   /* it ran already */
        :: else ->
            ph[i] = HANDLING; holds[i] = 1;
            if :: !hdes[i] -> running[i] = 1 :: else -> skip fi;  /* on_resume starts them */
            printf("MSC: w%d reads L%d gen %d: %e starts\n", w, l, hg[i], (hdes[i] -> m_on_pause : m_on_resume))
        fi
       }
    /* the handler returns (it took time: others ran meanwhile); then the acknowledgement */
    :: atomic {
        RUN(w) && ph[i] == HANDLING ->
        if
        :: running[i] = !hdes[i]; handled[i] = hg[i] + 1;
           printf("MSC: w%d: %e of L%d gen %d returns\n", w, (hdes[i] -> m_on_pause : m_on_resume), l, hg[i]);
           if
           :: !fenced[w] -> acknowledge(w, l, i)
           :: else ->                       /* nothing is acknowledged while fenced */
              ph[i] = IDLE; hg[i] = 0; hdes[i] = 0; hfr[i] = 0
           fi
        :: fails > 0 ->                     /* it raised: retried later, with backoff */
           fails--; ph[i] = IDLE; hg[i] = 0; hdes[i] = 0; hfr[i] = 0;
           printf("MSC: w%d: the handler of L%d raises\n", w, l);
#ifdef BUG_BASEEXC
           adead[w] = 1;                    /* seeded: the apply thread died */
#endif
           skip
        fi
       }
    /* on_remove returns: the location is gone, or still that tombstone: acknowledge it */
    :: atomic {
        RUN(w) && ph[i] == REMOVING ->
        if
        :: running[i] = 0; holds[i] = 0; applied[i] = 0; handled[i] = 0;
           printf("MSC: w%d: on_remove of L%d returns\n", w, l);
           if
           :: ht[i] == 0 -> forget(i)
           :: else ->
               if
               :: rex[l] && rdel[l] && rtomb[l] == ht[i] -> ackt[i] = ht[i]; appt[i] = ht[i]
               :: else -> skip
               fi
           fi;
           ph[i] = IDLE; ht[i] = 0
        :: fails > 0 -> fails--; ph[i] = IDLE; ht[i] = 0
        fi
       }
    od
}

/* ---------------------------------------------------------------- faults */
inline crash(w, l) {
    up[w] = 0; frozen[w] = 0; part[w] = 0; fenced[w] = 0;
#ifdef BUG_BASEEXC
    adead[w] = 0;
#endif
    for (l : 0 .. NL - 1) {
        running[IX(w, l)] = 0; holds[IX(w, l)] = 0; forget(IX(w, l));
        ph[IX(w, l)] = 0; hg[IX(w, l)] = 0; hdes[IX(w, l)] = 0; hfr[IX(w, l)] = 0; ht[IX(w, l)] = 0
    }
    l = 0
}

/* Agent.start: register with a fresh lease; every record is then read (the apply step) */
inline start(w) {
    up[w] = 1; reg[w] = 1; age[w] = 0
}

/* NFAULT faults in all, one at a time (each a start and an end). The workers are alike, so the
 * first fault is worker 0's (a run where it is worker 1's is the same with the names swapped);
 * handler failures happen to any worker. */
#define BEAT_PHASE(w) if :: skip :: age[w] < HB -> age[w] = HB :: else -> skip fi
proctype Fault() {
    byte w; byte l; byte n = NFAULT;
    do
    :: n == 0 -> break
    :: n > 0 ->
        if :: n == NFAULT -> w = 0 :: else -> select (w : 0 .. NW - 1) fi;
        n--;
        if
        :: skip
        :: atomic { RUN(w) -> crash(w, l); BEAT_PHASE(w); printf("MSC: w%d crashes\n", w) };
           if :: atomic { start(w); printf("MSC: w%d starts again\n", w) } :: skip fi
        :: atomic { RUN(w) -> frozen[w] = 1; BEAT_PHASE(w); printf("MSC: w%d is frozen\n", w) };
           atomic {                                     /* ... SIGCONT: the fence check first */
               frozen[w] = 0; printf("MSC: w%d thaws\n", w);
#ifndef BUG_NO_FENCE
               if :: FENCE_DUE(w) -> fenced[w] = 1 :: else -> skip fi
#endif
           }
        :: atomic { RUN(w) -> part[w] = 1; BEAT_PHASE(w); printf("MSC: w%d loses the backend\n", w) };
           atomic { part[w] = 0; printf("MSC: w%d reaches the backend again\n", w) }
        :: atomic { !up[w] && !reg[w] -> start(w); printf("MSC: w%d joins\n", w) }
        fi;
        w = 0
    od
}

/* ---------------------------------------------------------------- time */
/* Time cannot pass a deadline a running worker must meet: its heartbeat (when heartbeats
 * work), its self-fence, and the fence's pause handlers. These are the timing assumptions of
 * the design (heartbeat interval < lease - margin; pause handlers finish within the margin). */
#ifdef BUG_NO_FENCE
#define URGENT(w) (RUN(w) && !part[w] && BEAT_DUE(w))
#else
#define URGENT(w) (RUN(w) && ((!part[w] && BEAT_DUE(w)) || (!fenced[w] && FENCE_DUE(w)) || \
                              (fenced[w] && !FENCE_DONE(w))))
#endif
/* Time passes only while a deadline is pending (a schedule, a tombstone's ttl, a lease that is
 * not renewed): otherwise no guard depends on it, a heartbeating worker's lease holds. */
#define HEALTHY(w) (up[w] && !frozen[w] && !part[w])
#define AGING(w) (reg[w] && age[w] < AGE_MAX && !HEALTHY(w))
#if NW == 2
#define ANY_URGENT (URGENT(0) || URGENT(1))
#define ANY_AGING  (AGING(0) || AGING(1))
#elif NW == 3
#define ANY_URGENT (URGENT(0) || URGENT(1) || URGENT(2))
#define ANY_AGING  (AGING(0) || AGING(1) || AGING(2))
#endif
#if NL == 1
#define TIME_PENDING (ANY_AGING || (rsch[0] && rres[0] > 0) || (rdel[0] && rttl[0] > 0))
#else
#define TIME_PENDING (ANY_AGING || (rsch[0] && rres[0] > 0) || (rdel[0] && rttl[0] > 0) || \
                      (rsch[1] && rres[1] > 0) || (rdel[1] && rttl[1] > 0))
#endif

active proctype Tick() {
    byte i;
end:
    do
    :: atomic {
        !ANY_URGENT && TIME_PENDING ->
        for (i : 0 .. NW - 1) {
            if :: AGING(i) -> age[i]++ :: else -> skip fi
        }
        printf("MSC: tick\n");
        for (i : 0 .. NL - 1) {
            if :: rsch[i] && rres[i] > 0 -> rres[i]-- :: else -> skip fi;
            if :: rdel[i] && rttl[i] > 0 -> rttl[i]-- :: else -> skip fi
        }
        i = 0
       }
    od
}

/* ---------------------------------------------------------------- safety: paused means stopped */
/* never settled `paused` while a live (running, not frozen), unfenced worker's consumers run */
#define RL(w, l) (up[w] && !frozen[w] && !fenced[w] && running[IX(w, l)])
#if NW == 2
#define ANY_RL(l) (RL(0, l) || RL(1, l))
#elif NW == 3
#define ANY_RL(l) (RL(0, l) || RL(1, l) || RL(2, l))
#endif
#define BAD(l) (rex[l] && !rdel[l] && rst[l] == PAUSED && ANY_RL(l))
#if NL == 1
#define ANY_BAD BAD(0)
#else
#define ANY_BAD (BAD(0) || BAD(1))
#endif

active proctype PausedMeansStopped() {
end: atomic { ANY_BAD -> CHECK(!ANY_BAD, "VIOLATED: paused while a live worker runs\n") }
}

/* ---------------------------------------------------------------- liveness (LTL, weak fairness) */
#define TRANSITIONAL(l) (rex[l] && !rdel[l] && TRANS(rst[l]))
#define TOMBSTONE(l)    (rex[l] && rdel[l])
#define OWED(w, l)      (holds[IX(w, l)] && !rex[l])
#if NW == 2
#define ANY_OWED(l)     (OWED(0, l) || OWED(1, l))
#else
#define ANY_OWED(l)     (OWED(0, l) || OWED(1, l) || OWED(2, l))
#endif
/* Every pausing/resuming settles; every tombstone is purged (or restored); every worker that
 * applied a removed location runs on_remove for it (or the location comes back).
 *
 * Every budget of the model is finite and its clock stops once no deadline is pending, so the
 * model has no infinite run (pan -l, with no progress label, finds no cycle: check.sh's
 * `acyclic` run): every run ends where no process can move. There, each of these must hold;
 * `timeout` is that state, so this assertion checks the liveness properties in every safety
 * run, for any scheduling. The LTL formula below checks them too, under weak fairness. */
#if NL == 1
#define NONE_TRANSITIONAL (!TRANSITIONAL(0))
#define NO_TOMBSTONE (!TOMBSTONE(0))
#define NONE_OWED (!ANY_OWED(0))
#else
#define NONE_TRANSITIONAL (!TRANSITIONAL(0) && !TRANSITIONAL(1))
#define NO_TOMBSTONE (!TOMBSTONE(0) && !TOMBSTONE(1))
#define NONE_OWED (!ANY_OWED(0) && !ANY_OWED(1))
#endif
active proctype Quiescent() {
end: atomic {
        timeout ->
        CHECK(NONE_TRANSITIONAL, "VIOLATED: a pausing/resuming that never settles\n");
        CHECK(NO_TOMBSTONE, "VIOLATED: a tombstone never purged\n");
        CHECK(NONE_OWED, "VIOLATED: an on_remove never run\n")
     }
}

ltl live {
    [] (TRANSITIONAL(0) -> <> !TRANSITIONAL(0)) &&
    [] (TOMBSTONE(0) -> <> !TOMBSTONE(0)) &&
    [] (ANY_OWED(0) -> <> (!ANY_OWED(0) || rex[0]))
}

/* ---------------------------------------------------------------- the system */
init {
    byte i;
    atomic {
        for (i : 0 .. NL - 1) {
            rex[i] = 1; rinc[i] = 1; rgen[i] = INIT_GEN; rst[i] = (INIT_GEN % 2 -> PAUSED : RUNNING);
#ifdef BUG_ACK_NO_INCARNATION
            rcnt[i] = 1 + INIT_GEN;
#endif
            oloc[0] = NL    /* no location yet */
        }
        for (i : 0 .. NOPR - 1) { oloc[i] = NL }
        fails = NFAIL;
        for (i : 0 .. NW - 1) {
            if :: i >= DOWN -> start(i) :: else -> skip fi;
            run Heartbeat(i)
        }
        for (i : 0 .. NWL - 1) { run Apply(i / NL, i % NL) }
        for (i : 0 .. NOPR - 1) { run Operator(i) }
        for (i : 0 .. NL - 1) {
            run Settle(i);
            run Fire(0, i);
#if NFIRE > 1
            run Fire(1, i);
#endif
            run Purge(i)
        }
        run Expire();
        run Fault();
        i = 0
    }
}
