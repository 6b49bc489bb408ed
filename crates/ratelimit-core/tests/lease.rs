//! The lease protocol (`ratelimit_core::lease`) in a simulated fleet: instances whose
//! requests arrive at random and hold permits for random times, a Redis that runs `serve`
//! for each request it receives, and a network that delays, loses, reorders and duplicates
//! messages; instances crash and come back as new ones. Time moves in 10 ms ticks; each
//! instance sends one request per 100 ms interval, at its own phase; leases live 300 ms.
//!
//! Checked at every tick: the leases the live instances hold add up to at most the limit; an
//! instance's lease is never more than its record in Redis; its permits in use stay within
//! its lease unless the lease expired under them (Redis unreachable for 300 ms), which never
//! happens when no message is lost and delays are short. And under steady demand the fleet
//! keeps the limit busy: one instance with all the traffic comes to hold nearly all of it.

use std::collections::{BTreeMap, BinaryHeap};

use proptest::prelude::*;
use ratelimit_core::lease::{
    serve_since, Holder, LeaseHolder, LeaseReply, LeaseRequest, EXPIRY_ROUNDS,
};

const TICK_MS: u64 = 10;
const INTERVAL_MS: u64 = 100;
const TTL_MS: u64 = EXPIRY_ROUNDS * INTERVAL_MS;

/// A small deterministic generator (xorshift64*), seeded by proptest.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            0
        } else {
            self.next() % bound
        }
    }

    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

#[derive(Clone, Copy, Debug)]
struct Network {
    /// Each message's delay is uniform in 0..=max_delay_ms.
    max_delay_ms: u64,
    loss_per_mille: u64,
    duplicate_per_mille: u64,
}

enum Message {
    ToRedis(LeaseRequest),
    /// To the instance at this index, in this incarnation.
    ToInstance(usize, u64, LeaseReply),
}

/// A message in flight, ordered by delivery time (then by sending order).
struct InFlight {
    at_ms: u64,
    order: u64,
    message: Message,
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.at_ms, self.order) == (other.at_ms, other.order)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at_ms, other.order).cmp(&(self.at_ms, self.order))
    }
}

/// An instance of the fleet: its lease side, its requests in flight (their end times), and
/// its closed-loop clients (each sends again as soon as its last request ends or is refused).
struct Instance {
    holder: LeaseHolder,
    incarnation: u64,
    alive: bool,
    phase_ms: u64,
    ends: Vec<u64>,
    clients: usize,
}

struct Fleet {
    limit: u32,
    network: Network,
    rng: Rng,
    redis: BTreeMap<u64, Holder>,
    /// When Redis's lease records began (`serve_since`): `None` after a restart.
    since: Option<u64>,
    instances: Vec<Instance>,
    messages: BinaryHeap<InFlight>,
    order: u64,
    next_id: u64,
    now_ms: u64,
    /// Requests of fixed length, and closed-loop clients, for the demand runs.
    hold_ms: Option<u64>,
}

impl Fleet {
    fn new(count: usize, limit: u32, network: Network, seed: u64) -> Fleet {
        let mut rng = Rng(seed | 1);
        let instances = (0..count)
            .map(|index| Instance {
                holder: LeaseHolder::new(index as u64 + 1),
                incarnation: 0,
                alive: true,
                phase_ms: rng.below(INTERVAL_MS / TICK_MS) * TICK_MS,
                ends: Vec::new(),
                clients: 0,
            })
            .collect();
        Fleet {
            limit,
            network,
            rng,
            redis: BTreeMap::new(),
            since: None,
            instances,
            messages: BinaryHeap::new(),
            order: 0,
            next_id: count as u64 + 1,
            now_ms: 0,
            hold_ms: None,
        }
    }

    fn send(&mut self, message: Message) {
        if self.rng.chance(self.network.loss_per_mille) {
            return;
        }
        let copies = if self.rng.chance(self.network.duplicate_per_mille) {
            2
        } else {
            1
        };
        for copy in 0..copies {
            let delay = self.rng.below(self.network.max_delay_ms + 1);
            self.order += 1;
            let message = match (&message, copy) {
                (Message::ToRedis(request), _) => Message::ToRedis(*request),
                (Message::ToInstance(index, incarnation, reply), _) => {
                    Message::ToInstance(*index, *incarnation, *reply)
                }
            };
            self.messages.push(InFlight {
                at_ms: self.now_ms + delay,
                order: self.order,
                message,
            });
        }
    }

    fn deliver(&mut self) {
        while self
            .messages
            .peek()
            .is_some_and(|message| message.at_ms <= self.now_ms)
        {
            let Some(InFlight { message, .. }) = self.messages.pop() else {
                break;
            };
            match message {
                Message::ToRedis(request) => {
                    let reply = serve_since(
                        &mut self.since,
                        &mut self.redis,
                        self.limit,
                        &request,
                        self.now_ms,
                        TTL_MS,
                    );
                    let index = self
                        .instances
                        .iter()
                        .position(|instance| instance.holder.instance == request.instance);
                    if let Some(index) = index {
                        let incarnation = self.instances[index].incarnation;
                        self.send(Message::ToInstance(index, incarnation, reply));
                    }
                }
                Message::ToInstance(index, incarnation, reply) => {
                    let now = self.now_ms;
                    let instance = &mut self.instances[index];
                    if instance.alive && instance.incarnation == incarnation {
                        instance.holder.apply(&reply, now, TTL_MS);
                    }
                }
            }
        }
    }

    /// One tick: messages delivered, requests ended, new ones started (`arrivals` per
    /// instance, or the closed-loop clients), each instance's round at its phase.
    fn tick(&mut self, arrivals: &[u64]) {
        self.deliver();
        let now = self.now_ms;
        let hold_ms = self.hold_ms;
        let mut rounds = Vec::new();
        for (index, instance) in self.instances.iter_mut().enumerate() {
            if !instance.alive {
                continue;
            }
            let before = instance.ends.len();
            instance.ends.retain(|&end| end > now);
            for _ in instance.ends.len()..before {
                instance.holder.release();
            }
            let wanted = match hold_ms {
                Some(_) => instance.clients.saturating_sub(instance.ends.len()) as u64,
                None => arrivals.get(index).copied().unwrap_or(0),
            };
            for _ in 0..wanted {
                if instance.holder.acquire(now) {
                    let hold = hold_ms.unwrap_or_else(|| 10 + self.rng.below(500));
                    instance.ends.push(now + hold);
                }
            }
            if now % INTERVAL_MS == instance.phase_ms {
                rounds.push(instance.holder.request(now, self.limit));
            }
        }
        for request in rounds {
            self.send(Message::ToRedis(request));
        }
    }

    /// The instance at `index` crashes: its requests die with it.
    fn crash(&mut self, index: usize) {
        let instance = &mut self.instances[index];
        instance.alive = false;
        instance.ends.clear();
    }

    /// It comes back as a new instance (a new id, nothing leased).
    fn restart(&mut self, index: usize) {
        self.next_id += 1;
        let instance = &mut self.instances[index];
        instance.alive = true;
        instance.incarnation += 1;
        instance.holder = LeaseHolder::new(self.next_id);
    }

    /// A live instance's lease now (nothing once expired on its clock).
    fn lease(&self, index: usize) -> u32 {
        let holder = &self.instances[index].holder;
        if self.now_ms >= holder.expires_ms {
            0
        } else {
            holder.lease
        }
    }

    fn in_use(&self) -> u32 {
        self.instances
            .iter()
            .filter(|instance| instance.alive)
            .map(|instance| instance.holder.in_use)
            .sum()
    }

    /// The invariants, at this tick.
    fn check(&self) -> Result<(), String> {
        let mut held = 0;
        for (index, instance) in self.instances.iter().enumerate() {
            if !instance.alive {
                continue;
            }
            let lease = self.lease(index);
            held += lease;
            let record = self
                .redis
                .get(&instance.holder.instance)
                .filter(|record| record.expires_ms > self.now_ms)
                .map_or(0, |record| record.lease);
            if lease > record {
                return Err(format!(
                    "at {} ms instance {index} holds {lease} but Redis records {record}",
                    self.now_ms
                ));
            }
            let holder = &instance.holder;
            if holder.in_use > lease && holder.expired_in_use == 0 {
                return Err(format!(
                    "at {} ms instance {index} has {} permits in use on a lease of {lease}",
                    self.now_ms, holder.in_use
                ));
            }
        }
        let recorded: u32 = self
            .redis
            .values()
            .filter(|record| record.expires_ms > self.now_ms)
            .map(|record| record.lease)
            .sum();
        if held > self.limit || recorded > self.limit {
            return Err(format!(
                "at {} ms leases held {held}, recorded {recorded}, over the limit {}",
                self.now_ms, self.limit
            ));
        }
        Ok(())
    }

    fn expired_in_use(&self) -> u64 {
        self.instances
            .iter()
            .map(|instance| instance.holder.expired_in_use)
            .sum()
    }
}

fn networks() -> impl Strategy<Value = Network> {
    (0u64..=400, 0u64..=300, 0u64..=100).prop_map(|(max_delay_ms, loss, duplicate)| Network {
        max_delay_ms,
        loss_per_mille: loss,
        duplicate_per_mille: duplicate,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any fleet, any load, any network, crashes and restarts: the invariants hold at every
    /// tick.
    #[test]
    fn leases_never_exceed_the_limit(
        count in 1usize..=4,
        limit in 1u32..=20,
        network in networks(),
        seed in any::<u64>(),
        load in prop::collection::vec(0u64..=4, 4),
        crashes in prop::collection::vec((0u64..400, 0u64..4, any::<bool>()), 0..4),
    ) {
        let mut fleet = Fleet::new(count, limit, network, seed);
        for tick in 0..400u64 {
            fleet.now_ms = tick * TICK_MS;
            for &(at, index, restart) in &crashes {
                let index = index as usize % count;
                if at == tick {
                    fleet.crash(index);
                }
                if restart && at + 50 == tick && !fleet.instances[index].alive {
                    fleet.restart(index);
                }
            }
            let arrivals: Vec<u64> = (0..count)
                .map(|index| fleet.rng.below(load[index] + 1))
                .collect();
            fleet.tick(&arrivals);
            if let Err(error) = fleet.check() {
                return Err(TestCaseError::fail(format!("{error} ({network:?})")));
            }
        }
    }

    /// While Redis answers every request within 90 ms (no loss), no lease ever expires
    /// under requests in flight: permits in use stay within the limit throughout.
    #[test]
    fn no_lease_expires_while_redis_answers(
        count in 1usize..=4,
        limit in 1u32..=20,
        max_delay_ms in 0u64..=90,
        seed in any::<u64>(),
        load in prop::collection::vec(0u64..=4, 4),
    ) {
        let network = Network { max_delay_ms, loss_per_mille: 0, duplicate_per_mille: 50 };
        let mut fleet = Fleet::new(count, limit, network, seed);
        for tick in 0..400u64 {
            fleet.now_ms = tick * TICK_MS;
            let arrivals: Vec<u64> = (0..count)
                .map(|index| fleet.rng.below(load[index] + 1))
                .collect();
            fleet.tick(&arrivals);
            prop_assert!(fleet.check().is_ok(), "{:?}", fleet.check());
            prop_assert!(fleet.in_use() <= limit);
        }
        prop_assert_eq!(fleet.expired_in_use(), 0);
    }

    /// Redis restarted empty at any moment (every record lost while the instances hold
    /// their leases), Redis answering within 90 ms otherwise: the instance that finds its
    /// lease forgotten keeps only what is in use, none grows until the others' claims are
    /// in, and the permits in use stay within the limit throughout.
    #[test]
    fn a_redis_restart_keeps_permits_in_use_within_the_limit(
        count in 1usize..=4,
        limit in 1u32..=20,
        max_delay_ms in 0u64..=90,
        seed in any::<u64>(),
        load in prop::collection::vec(0u64..=4, 4),
        restarts in prop::collection::vec(20u64..380, 1..3),
    ) {
        let network = Network { max_delay_ms, loss_per_mille: 0, duplicate_per_mille: 50 };
        let mut fleet = Fleet::new(count, limit, network, seed);
        for tick in 0..400u64 {
            fleet.now_ms = tick * TICK_MS;
            if restarts.contains(&tick) {
                fleet.redis.clear();
                fleet.since = None;
            }
            let arrivals: Vec<u64> = (0..count)
                .map(|index| fleet.rng.below(load[index] + 1))
                .collect();
            fleet.tick(&arrivals);
            prop_assert!(
                fleet.in_use() <= limit,
                "{} in use at {} ms, over {limit}", fleet.in_use(), fleet.now_ms
            );
        }
    }
}

/// What the test asks of the wiring, on the protocol alone: three instances,
/// limit=12, requests of 0.5 s from 12 closed-loop clients per instance for 6 s, then all 36
/// on one instance for 6 s. Never more than 12 in flight, and from the 2nd second of each
/// phase on at least 10.2 on average; in the second phase the busy instance holds nearly all
/// of the limit.
#[test]
fn steady_demand_keeps_the_limit_busy() {
    let mut lowest = (f64::MAX, f64::MAX, f64::MAX);
    for seed in 1..=20u64 {
        let network = Network {
            max_delay_ms: 20,
            loss_per_mille: 0,
            duplicate_per_mille: 0,
        };
        let mut fleet = Fleet::new(3, 12, network, seed);
        fleet.hold_ms = Some(500);
        let mut phases = [(0u64, 0u64); 2];
        let mut busy_lease = (0u64, 0u64);
        for tick in 0..1200u64 {
            fleet.now_ms = tick * TICK_MS;
            let phase = (tick / 600) as usize;
            for (index, instance) in fleet.instances.iter_mut().enumerate() {
                instance.clients = match (phase, index) {
                    (0, _) => 12,
                    (_, 0) => 36,
                    _ => 0,
                };
            }
            fleet.tick(&[]);
            fleet.check().unwrap();
            let in_use = fleet.in_use();
            assert!(
                in_use <= 12,
                "seed {seed}: {in_use} in flight at {} ms",
                fleet.now_ms
            );
            if tick % 600 >= 100 {
                phases[phase].0 += u64::from(in_use);
                phases[phase].1 += 1;
                if phase == 1 {
                    busy_lease.0 += u64::from(fleet.lease(0));
                    busy_lease.1 += 1;
                }
            }
        }
        for (phase, (sum, ticks)) in phases.iter().enumerate() {
            let mean = *sum as f64 / *ticks as f64;
            assert!(
                mean >= 10.2,
                "seed {seed}: phase {phase} averaged {mean:.2} in flight"
            );
        }
        let mean_lease = busy_lease.0 as f64 / busy_lease.1 as f64;
        assert!(
            mean_lease >= 11.0,
            "seed {seed}: the busy instance held {mean_lease:.2}"
        );
        let mean = |phase: usize| phases[phase].0 as f64 / phases[phase].1 as f64;
        lowest = (
            lowest.0.min(mean(0)),
            lowest.1.min(mean(1)),
            lowest.2.min(mean_lease),
        );
    }
    eprintln!(
        "lowest of 20 runs: {:.2} in flight on average (even), {:.2} (one instance), which held \
         {:.2} of 12",
        lowest.0, lowest.1, lowest.2
    );
}

/// A crashed instance's leases are back in the fleet within three intervals of its last
/// request: another instance with demand holds the whole limit by then (plus its own round
/// trip and one interval to ask).
#[test]
fn a_crashed_instances_lease_comes_back_within_three_intervals() {
    let network = Network {
        max_delay_ms: 10,
        loss_per_mille: 0,
        duplicate_per_mille: 0,
    };
    let mut fleet = Fleet::new(2, 10, network, 3);
    fleet.hold_ms = Some(500);
    for instance in &mut fleet.instances {
        instance.clients = 20;
    }
    let mut crashed_at = None;
    for tick in 0..600u64 {
        fleet.now_ms = tick * TICK_MS;
        if tick == 200 {
            assert!(
                fleet.lease(1) > 0,
                "instance 1 held nothing before its crash"
            );
            fleet.crash(1);
            crashed_at = Some(fleet.now_ms);
        }
        fleet.tick(&[]);
        fleet.check().unwrap();
        if let Some(at) = crashed_at {
            if fleet.lease(0) == 10 {
                let took = fleet.now_ms - at;
                eprintln!("the whole limit back on the other instance {took} ms after the crash");
                assert!(
                    took <= TTL_MS + 2 * INTERVAL_MS,
                    "the whole limit came back {took} ms after the crash"
                );
                return;
            }
        }
    }
    panic!("the crashed instance's lease never came back");
}
