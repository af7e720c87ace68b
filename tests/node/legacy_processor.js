'use strict';
// A stand-in for Backbeat's queue processors (replication's QueueProcessor and its task.js,
// ingestion's the same way), for locstatus's bridge tests. It uses the npm clients Backbeat
// uses (ioredis, node-zookeeper-client) and does, on the same inputs, what Backbeat's
// processors do (extensions/replication/queueProcessor/QueueProcessor.js and task.js):
//
// - at start, per site: create <namespace>/state/<site> as {"paused":false}, or read it when
//   it exists; a scheduledResume already passed: write {"paused":false} and start running; one
//   ahead: arm an in-process timer and start paused; else start paused if it says so;
// - subscribe to the Redis channel <topic>-<site>; on {"action": ...}:
//   pauseService: if the consumer runs, read the state node, set paused: true, write it back
//     without a version, and once that write succeeded pause the consumer (then clear
//     scheduledResume the same way);
//   resumeService: if the consumer is paused: with a future "date", write scheduledResume and
//     arm a timer; without one, write paused: false, then resume the consumer;
//   deleteScheduledResumeService: write scheduledResume: null, cancel the timer.
//
// The "consumer" is a flag. Every step is printed on stdout as one JSON line, for the test:
// {"event": "ready"|"message"|"paused"|"resumed"|"scheduled"|"timer"|"redis"|"error", ...}.
// Options: --zookeeper HOSTS[/chroot] --redis HOST:PORT --topic T --namespace NS --sites a,b
//          [--drop N] (ignore the first N messages: a message lost on the way)
//          [--password P] (Redis AUTH, as Backbeat's redis.password).
const Redis = require('ioredis');
const zookeeper = require('node-zookeeper-client');

function args() {
    const out = { drop: '0' };
    const argv = process.argv.slice(2);
    for (let i = 0; i < argv.length; i += 2) {
        out[argv[i].replace(/^--/, '')] = argv[i + 1];
    }
    return out;
}

const opts = args();
let toDrop = parseInt(opts.drop, 10);

function emit(event, fields) {
    process.stdout.write(`${JSON.stringify(Object.assign({ event, t: Date.now() }, fields))}\n`);
}

const zk = zookeeper.createClient(opts.zookeeper, { sessionTimeout: 10000 });

class Processor {
    constructor(site) {
        this.site = site;
        this.path = `${opts.namespace}/state/${site}`;
        this.enabled = true;
        this.timer = null;
    }

    updateState(key, value, cb) {
        zk.getData(this.path, (err, data) => {
            if (err) {
                emit('error', { site: this.site, op: 'getData', error: err.message });
                return cb(err);
            }
            let state;
            try {
                state = JSON.parse(data.toString());
            } catch (e) {
                emit('error', { site: this.site, op: 'parse', error: e.message });
                return cb(e);
            }
            state[key] = value;
            return zk.setData(this.path, Buffer.from(JSON.stringify(state)), -1, err2 => {
                if (err2) {
                    emit('error', { site: this.site, op: 'setData', error: err2.message });
                }
                return cb(err2);
            });
        });
    }

    pauseService() {
        if (!this.enabled) {
            return;
        }
        this.updateState('paused', true, err => {
            if (!err) {
                this.enabled = false;
                emit('paused', { site: this.site });
                this.deleteScheduledResumeService();
            }
        });
    }

    resumeService(date) {
        if (this.enabled) {
            emit('noop', { site: this.site, why: 'cannot resume, not paused' });
            return;
        }
        if (date && new Date() < new Date(date)) {
            this.scheduleResume(date);
            return;
        }
        this.updateState('paused', false, err => {
            if (!err) {
                this.enabled = true;
                emit('resumed', { site: this.site });
                this.deleteScheduledResumeService();
            }
        });
    }

    deleteScheduledResumeService() {
        this.updateState('scheduledResume', null, err => {
            if (!err && this.timer) {
                clearTimeout(this.timer);
                this.timer = null;
            }
        });
    }

    scheduleResume(date) {
        this.updateState('scheduledResume', date, err => {
            if (!err) {
                if (this.timer) {
                    clearTimeout(this.timer);
                }
                const delay = Math.max(0, new Date(date) - new Date());
                this.timer = setTimeout(() => {
                    this.timer = null;
                    emit('timer', { site: this.site });
                    this.updateState('scheduledResume', null, () => this.resumeService());
                }, Math.min(delay, 2147483647));
                emit('scheduled', { site: this.site, date });
            }
        });
    }

    setup(cb) {
        zk.create(this.path, Buffer.from(JSON.stringify({ paused: false })), err => {
            if (err && err.getCode() === zookeeper.Exception.NODE_EXISTS) {
                return zk.getData(this.path, (err2, data) => {
                    if (err2) {
                        return cb(err2);
                    }
                    let d;
                    try {
                        d = JSON.parse(data.toString());
                    } catch (e) {
                        return cb(e);
                    }
                    if (d.scheduledResume) {
                        if (new Date() >= new Date(d.scheduledResume)) {
                            return zk.setData(this.path,
                                Buffer.from(JSON.stringify({ paused: false })), -1,
                                err3 => cb(err3, { paused: false }));
                        }
                        this.enabled = false;
                        this.scheduleResume(d.scheduledResume);
                        return cb(null, { paused: true });
                    }
                    return cb(null, d);
                });
            }
            if (err) {
                return cb(err);
            }
            return cb(null, { paused: false });
        });
    }

    subscribe() {
        const [host, port] = opts.redis.split(':');
        const redis = new Redis({ host, port: parseInt(port, 10), password: opts.password,
            retryStrategy: () => 100, maxRetriesPerRequest: null });
        const channel = `${opts.topic}-${this.site}`;
        redis.on('ready', () => emit('redis', { site: this.site, state: 'ready' }));
        redis.on('end', () => emit('redis', { site: this.site, state: 'end' }));
        redis.on('close', () => emit('redis', { site: this.site, state: 'close' }));
        redis.on('error', () => {});
        redis.subscribe(channel, err => {
            if (err) {
                emit('error', { site: this.site, op: 'subscribe', error: err.message });
                process.exit(1);
            }
            emit('subscribed', { site: this.site, channel });
        });
        redis.on('message', (ch, message) => {
            if (toDrop > 0) {
                toDrop -= 1;
                emit('dropped', { site: this.site, message });
                return;
            }
            const actions = {
                pauseService: this.pauseService.bind(this),
                resumeService: this.resumeService.bind(this),
                deleteScheduledResumeService: this.deleteScheduledResumeService.bind(this),
            };
            try {
                const { action, date } = JSON.parse(message);
                emit('message', { site: this.site, action, date: date === undefined ? null : date });
                const cmd = actions[action];
                if (ch === channel && typeof cmd === 'function') {
                    cmd(date);
                }
            } catch (e) {
                emit('error', { site: this.site, op: 'message', error: e.message });
            }
        });
    }
}

zk.once('connected', () => {
    zk.mkdirp(`${opts.namespace}/state`, err => {
        if (err) {
            emit('error', { op: 'mkdirp', error: err.message });
            process.exit(1);
        }
        const sites = opts.sites.split(',').filter(s => s);
        let pending = sites.length;
        sites.forEach(site => {
            const p = new Processor(site);
            p.setup((err2, data) => {
                if (err2) {
                    emit('error', { site, op: 'setup', error: err2.message });
                    process.exit(1);
                }
                p.enabled = !data.paused;
                p.subscribe();
                emit('ready', { site, paused: !!data.paused });
                pending -= 1;
                if (pending === 0) {
                    emit('started', { sites });
                }
            });
        });
    });
});
zk.connect();
process.on('SIGTERM', () => process.exit(0));
