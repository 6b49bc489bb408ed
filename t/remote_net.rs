//! `$rate_limit_remote_net`: a client's network as a key. Clients come through
//! `X-Forwarded-For` and `real_ip` (the variable reads the address real_ip rewrote), with
//! `rate_limit_remote_net ipv4=24 ipv6=64`: the addresses of one network share a budget, the
//! next network has its own, and the admin API shows and takes the keys as `198.51.100.0/24`
//! and `2001:db8:0:1::/64`.

mod common;

use common::{check_config, config, send, Nginx, Request};
use serde_json::Value;

/// nginx with zone `net` (1r/m, burst 2, `/`) and zone `guarded` (the same with `block=1h`,
/// `/guarded/`), both keyed by the client's network, and the admin API at `/ratelimit/`.
fn start() -> Nginx {
    let nginx = config()
        .http(
            "set_real_ip_from 127.0.0.1;\n\
             real_ip_header X-Forwarded-For;\n\
             rate_limit_remote_net ipv4=24 ipv6=64;\n\
             rate_limit_zone $rate_limit_remote_net zone=net:1m rate=1r/m burst=2;\n\
             rate_limit_zone $rate_limit_remote_net zone=guarded:1m rate=1r/m burst=2 \
             block=1h;",
        )
        .locations(
            "location / { rate_limit zone=net nodelay; }\n\
             location /guarded/ { rate_limit zone=guarded nodelay; alias html/; }\n\
             location /hosts/ { rate_limit_remote_net ipv4=32 ipv6=128;\n\
                                rate_limit zone=net nodelay; alias html/; }\n\
             location /ratelimit/ { rate_limit_admin write=on; }",
        )
        .start();
    nginx.write_file("html/index.html", "ok\n");
    nginx
}

/// The statuses of one request from each of `clients`, in order.
fn statuses(nginx: &Nginx, path: &str, clients: &[&str]) -> Vec<u16> {
    clients
        .iter()
        .map(|client| {
            let request =
                Request::get(&format!("{path}index.html")).header("X-Forwarded-For", client);
            send(nginx.port(), &request).status
        })
        .collect()
}

fn admin(nginx: &Nginx, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let request = Request::new(method, &format!("/ratelimit/{path}"));
    let request = match body {
        Some(body) => request.json(body),
        None => request,
    };
    let response = send(nginx.port(), &request);
    let body = if response.body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&response.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", response.text()))
    };
    (response.status, body)
}

/// Four addresses of one /64 share its budget (three pass), an address of the next /64 has
/// its own; the same with IPv4 and /24.
#[test]
fn addresses_of_one_network_share_its_budget() {
    let nginx = start();
    let one_64 = [
        "2001:db8:0:1::1",
        "2001:db8:0:1::2",
        "2001:db8:0:1:ffff:ffff:ffff:ffff",
        "2001:db8:0:1:8000::9",
    ];
    assert_eq!(statuses(&nginx, "/", &one_64), [200, 200, 200, 429]);
    assert_eq!(statuses(&nginx, "/", &["2001:db8:0:2::1"]), [200]);

    let one_24 = [
        "198.51.100.1",
        "198.51.100.2",
        "198.51.100.254",
        "198.51.100.77",
    ];
    assert_eq!(statuses(&nginx, "/", &one_24), [200, 200, 200, 429]);
    assert_eq!(statuses(&nginx, "/", &["198.51.101.1"]), [200]);

    // A location with its own prefix lengths: each address is a network of its own.
    let two = "198.51.100.2";
    let hosts = ["198.51.100.1", two, two, two, two];
    assert_eq!(
        statuses(&nginx, "/hosts/", &hosts),
        [200, 200, 200, 200, 429]
    );
}

/// The admin API shows the keys as networks (one key, the top keys) and takes them in that
/// form in `keys/`, `overrides/` and `blocked/`.
#[test]
fn the_admin_api_shows_and_takes_networks() {
    let nginx = start();
    let v6 = [
        "2001:db8:0:1::1",
        "2001:db8:0:1::2",
        "2001:db8:0:1::3",
        "2001:db8:0:1::4",
    ];
    assert_eq!(statuses(&nginx, "/", &v6), [200, 200, 200, 429]);
    let v4 = [
        "198.51.100.1",
        "198.51.100.2",
        "198.51.100.3",
        "198.51.100.4",
    ];
    assert_eq!(statuses(&nginx, "/", &v4), [200, 200, 200, 429]);

    let (status, key) = admin(&nginx, "GET", "zones/net/keys/2001:db8:0:1::/64", None);
    assert_eq!(status, 200, "{key}");
    assert_eq!(key["key"], "2001:db8:0:1::/64", "{key}");
    // Percent-encoded, and with host bits, the same network.
    let (status, key) = admin(&nginx, "GET", "zones/net/keys/198.51.100.9%2F24", None);
    assert_eq!(
        (status, &key["key"]),
        (200, &Value::from("198.51.100.0/24")),
        "{key}"
    );

    let (status, top) = admin(&nginx, "GET", "zones/net/top?by=rejected", None);
    assert_eq!(status, 200, "{top}");
    let mut shown: Vec<&str> = top["keys"]
        .as_array()
        .unwrap_or_else(|| panic!("no keys: {top}"))
        .iter()
        .filter_map(|key| key["key"].as_str())
        .collect();
    shown.sort();
    assert_eq!(shown, ["198.51.100.0/24", "2001:db8:0:1::/64"], "{top}");

    // Forgetting the /24 gives its addresses their budget back.
    let (status, _) = admin(&nginx, "DELETE", "zones/net/keys/198.51.100.0/24", None);
    assert_eq!(status, 204);
    assert_eq!(statuses(&nginx, "/", &["198.51.100.200"]), [200]);

    // An override of a network: burst 0, so its second address is refused.
    let (status, created) = admin(
        &nginx,
        "PUT",
        "zones/net/overrides/203.0.113.0/24",
        Some(r#"{"rate": "1r/m", "burst": 0}"#),
    );
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["key"], "203.0.113.0/24", "{created}");
    assert_eq!(
        statuses(&nginx, "/", &["203.0.113.5", "203.0.113.6"]),
        [200, 429]
    );

    // A rejection blocks the network for an hour; unblocked, it passes again.
    let guarded = [
        "192.0.2.1",
        "192.0.2.2",
        "192.0.2.3",
        "192.0.2.4",
        "192.0.2.5",
    ];
    assert_eq!(
        statuses(&nginx, "/guarded/", &guarded),
        [200, 200, 200, 429, 429]
    );
    let (status, block) = admin(&nginx, "GET", "zones/guarded/blocked/192.0.2.0/24", None);
    assert_eq!(status, 200, "{block}");
    assert_eq!(block["key"], "192.0.2.0/24", "{block}");
    // The release alone lets the network in: it forgets the network's count too.
    let (status, _) = admin(&nginx, "DELETE", "zones/guarded/blocked/192.0.2.0/24", None);
    assert_eq!(status, 204);
    assert_eq!(statuses(&nginx, "/guarded/", &["192.0.2.9"]), [200]);
}

/// Prefix lengths beyond the family's are refused by `nginx -t`, naming the word and the
/// range; so are unknown words and a second line in one context.
#[test]
fn bad_prefix_lengths_are_refused() {
    let cases = [
        (
            "rate_limit_remote_net ipv4=33;",
            "invalid ipv4 value \"ipv4=33\": it must be a prefix length from 0 to 32 in ",
        ),
        (
            "rate_limit_remote_net ipv6=129;",
            "invalid ipv6 value \"ipv6=129\": it must be a prefix length from 0 to 128 in ",
        ),
        (
            "rate_limit_remote_net ipv4=x;",
            "invalid ipv4 value \"ipv4=x\"",
        ),
        (
            "rate_limit_remote_net ip=24;",
            "invalid parameter \"ip=24\"",
        ),
        (
            "rate_limit_remote_net ipv4=24; rate_limit_remote_net ipv6=48;",
            "\"rate_limit_remote_net\" directive is duplicate",
        ),
    ];
    for (http, expected) in cases {
        let (ok, output) = check_config(&config().http(http).to_string());
        assert!(!ok, "nginx -t accepted {http}");
        assert!(output.contains(expected), "{http}: {output}");
    }
}
