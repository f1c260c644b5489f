"""The management web UI in a real browser (Debian's chromium through Playwright),
against a quorumq started by cluster-tests/compat/with-quorumq.sh: log in, read the
overview, find queues with their counts, publish / get / purge from a queue's page, add,
edit and delete a policy, close a connection, redrive a dead-letter queue, bind and
publish from an exchange's page, users / vhosts / permissions forms, and every page
without console errors. Outcomes are checked through AMQP (pika) or the HTTP API, not
only on the page.
"""
import uuid

import pika
import pika.exceptions
import pytest

from conftest import AMQP_URL, MGMT, api, depth, eventually, goto, login

PAGES = ["#/", "#/queues", "#/exchanges", "#/exchanges/%2F/amq.default", "#/exchanges/%2F/amq.topic",
         "#/connections", "#/channels", "#/nodes", "#/policies", "#/users", "#/vhosts"]


def name(prefix):
    return f"ui.{prefix}.{uuid.uuid4().hex[:8]}"


def quorum(ch, q, **args):
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum", **args})


def flash_ok(page, contains):
    """Waits for the success message containing `contains` (an error message fails)."""
    page.wait_for_function(
        "(t) => { const f = document.querySelector('#flash');"
        " return !f.hidden && (f.classList.contains('error') || f.textContent.includes(t)); }",
        arg=contains)
    text = page.inner_text("#flash")
    assert page.get_attribute("#flash", "class") == "ok" and contains in text, text


def test_login_refuses_bad_and_non_management_users_then_shows_the_overview(page, console):
    page.goto(MGMT + "/")
    page.fill("input[name=username]", "guest")
    page.fill("input[name=password]", "wrong")
    page.press("input[name=password]", "Enter")
    page.wait_for_selector("#login-error:not([hidden])")
    assert "Login failed" in page.inner_text("#login-error")

    user = name("plain")
    assert api("PUT", f"/api/users/{user}", {"password": "pw", "tags": ""})[0] in (201, 204)
    try:
        page.fill("input[name=username]", user)
        page.fill("input[name=password]", "pw")
        page.press("input[name=password]", "Enter")
        page.wait_for_function(
            "document.querySelector('#login-error').textContent.includes('Not management user')")
        assert page.is_hidden("#app")
    finally:
        api("DELETE", f"/api/users/{user}")
    console.errors.clear()  # the refused logins' 401s are logged by the browser

    login(page)
    goto(page, console, "#/")
    assert page.inner_text("#user") == "guest"
    assert page.inner_text("main h1") == "Overview"
    for total in ["Connections", "Channels", "Exchanges", "Queues", "Consumers", "Ready", "Unacked"]:
        assert page.is_visible(f"[data-total='{total}']"), total
    nodes = page.inner_text("main table")
    assert "quorumq@1" in nodes and "running" in nodes
    assert page.locator("svg.chart").count() == 2
    # It refreshes itself (every 5 s), and stays clean doing so.
    page.evaluate("delete document.body.dataset.refreshed")
    page.wait_for_function("document.body.dataset.refreshed !== undefined", timeout=12000)
    assert page.locator("svg.chart polyline").count() >= 2
    # The session survives a reload (sessionStorage), and logging out ends it.
    page.reload()
    page.wait_for_selector("#app:not([hidden])")
    page.click("#logout")
    page.wait_for_selector("#login:not([hidden])")
    page.reload()
    page.wait_for_selector("#login:not([hidden])")
    console.assert_clean("after logout")


def test_queue_list_shows_counts_filters_and_opens_a_queue(page, console, amqp):
    prefix = name("list")
    ch = amqp.channel()
    for i in range(3):
        quorum(ch, f"{prefix}.{i}")
    for _ in range(3):
        ch.basic_publish("", f"{prefix}.1", b"m")
    eventually("3 ready", lambda: depth(ch, f"{prefix}.1") == 3)
    login(page)
    goto(page, console, "#/queues")
    page.fill("#queue-filter", prefix)
    page.wait_for_function(
        f"document.querySelectorAll('#queue-list tbody tr').length === 3 && "
        f"document.querySelector('#queue-count').textContent.includes('3 matching')")
    row = page.locator("#queue-list tbody tr", has_text=f"{prefix}.1")
    cells = row.locator("td").all_inner_texts()
    assert cells[1] == f"{prefix}.1"
    assert cells[2] == "quorum"
    assert cells[3] == "quorumq@1"
    assert cells[4] == "1/1"
    assert cells[6:9] == ["3", "0", "3"], cells  # ready, unacked, total
    page.fill("#queue-filter", f"{prefix}.2")
    page.wait_for_function("document.querySelectorAll('#queue-list tbody tr').length === 1")
    page.fill("#queue-filter", f"{prefix}.1")
    page.wait_for_function(
        f"document.querySelector('#queue-list tbody tr td:nth-child(2)').textContent === '{prefix}.1'")
    page.click(f"#queue-list a:text-is('{prefix}.1')")
    page.wait_for_selector("#queue-name")
    assert page.url.endswith(f"#/queues/%2F/{prefix}.1")
    page.wait_for_function("document.querySelector('#q-ready') !== null")
    assert page.inner_text("#q-ready") == "3"
    console.assert_clean()


def test_publish_get_and_purge_through_the_queue_page(page, console, amqp):
    q = name("pub")
    ch = amqp.channel()
    quorum(ch, q)
    login(page)
    goto(page, console, f"#/queues/%2F/{q}")
    for body in ("first body", "second body"):
        page.fill("#publish-form textarea[name=payload]", body)
        page.click("#publish-form button[type=submit]")
        flash_ok(page, "Message published.")
        page.evaluate("document.querySelector('#flash').hidden = true")
    eventually("2 in the queue", lambda: depth(ch, q) == 2)
    page.wait_for_function("document.querySelector('#q-ready').textContent === '2'")
    # Its Raft members, with lag behind the leader (one node here: the leader, lag 0).
    members = page.locator("#queue-members tbody tr")
    members.first.wait_for()
    row = members.first.inner_text()
    assert "quorumq@1" in row and "leader" in row, row
    status, qs = api("GET", f"/api/queues/%2F/{q}/quorum-status")
    assert status == 200 and qs["members"][0]["lag"] == 0, qs

    # Get with the default ack mode (nack, requeue): seen, and still in the queue.
    page.click("#get-form button[type=submit]")
    page.wait_for_selector("#get-result .payload")
    assert page.inner_text("#get-result .payload") == "first body"
    eventually("still 2 after a requeueing get", lambda: depth(ch, q) == 2)

    # Automatic ack takes it.
    page.select_option("#get-form select[name=ackmode]", "ack_requeue_false")
    page.fill("#get-form input[name=count]", "1")
    page.press("#get-form input[name=count]", "Enter")
    eventually("1 left after an automatic-ack get", lambda: depth(ch, q) == 1)

    page.click("button:text-is('Purge Messages')")
    flash_ok(page, "Queue purged.")
    eventually("purged", lambda: depth(ch, q) == 0)
    page.wait_for_function("document.querySelector('#q-messages').textContent === '0'")
    console.assert_clean()


def test_policy_add_edit_and_delete(page, console):
    p = name("policy")
    login(page)
    goto(page, console, "#/policies")
    page.wait_for_selector("#policy-form")
    page.fill("#policy-name", p)
    page.fill("#policy-pattern", f"^{p}$")
    page.select_option("#policy-form select[name=apply_to]", "queues")
    page.fill("#policy-definition", '{"max-length": 5}')
    page.press("#policy-definition", "Enter")
    flash_ok(page, f"Policy {p} set.")
    row = page.locator("#policy-list tbody tr", has_text=p)
    row.wait_for()
    assert '"max-length":5' in row.inner_text()
    status, body = api("GET", f"/api/policies/%2F/{p}")
    assert status == 200 and body["definition"] == {"max-length": 5} and body["apply-to"] == "queues"

    row.locator("button:text-is('Edit')").click()
    assert page.input_value("#policy-name") == p
    page.fill("#policy-definition", '{"max-length": 7}')
    page.press("#policy-definition", "Enter")
    page.wait_for_function(
        f"[...document.querySelectorAll('#policy-list tbody tr')].some(r => r.textContent.includes('{p}') && r.textContent.includes('\"max-length\":7'))")
    assert api("GET", f"/api/policies/%2F/{p}")[1]["definition"] == {"max-length": 7}

    page.locator("#policy-list tbody tr", has_text=p).locator("button:text-is('Delete')").click()
    flash_ok(page, f"Policy {p} deleted.")
    page.wait_for_function(
        f"![...document.querySelectorAll('#policy-list tr')].some(r => r.textContent.includes('{p}'))")
    assert api("GET", f"/api/policies/%2F/{p}")[0] == 404
    console.assert_clean()


def test_close_a_connection(page, console):
    tag = name("conn")
    params = pika.URLParameters(AMQP_URL)
    params.client_properties = {"connection_name": tag}
    conn = pika.BlockingConnection(params)
    try:
        login(page)
        goto(page, console, "#/connections")
        row = page.locator("#connection-list tbody tr", has_text=tag)
        row.wait_for()
        assert "guest" in row.inner_text()
        row.locator("button:text-is('Close')").click()
        flash_ok(page, "Connection closed.")

        def closed():
            try:
                conn.process_data_events(time_limit=0.1)
            except pika.exceptions.AMQPConnectionError:
                return True
            return not conn.is_open

        eventually("the connection closed by the broker", closed)
        page.wait_for_function(
            f"![...document.querySelectorAll('#connection-list tr')].some(r => r.textContent.includes('{tag}'))")
        console.assert_clean()
    finally:
        if conn.is_open:
            conn.close()


def test_redrive_a_dead_letter_queue(page, console, amqp):
    src, dlq = name("src"), name("dlq")
    ch = amqp.channel()
    quorum(ch, dlq)
    quorum(ch, src, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    for i in range(4):
        ch.basic_publish("", src, f"job {i}".encode())
    eventually("4 in the source", lambda: depth(ch, src) == 4)
    for _ in range(4):
        m, _, _ = ch.basic_get(src)
        ch.basic_reject(m.delivery_tag, requeue=False)
    eventually("4 dead letters", lambda: depth(ch, dlq) == 4 and depth(ch, src) == 0)
    # The overview counts them (quorumq's message_stats.dead_lettered) and charts their rate.
    status, o = api("GET", "/api/overview")
    assert status == 200 and o["message_stats"]["dead_lettered"] >= 4, o["message_stats"]
    assert "rate" in o["message_stats"]["dead_lettered_details"]

    login(page)
    goto(page, console, "#/")
    page.wait_for_selector("text=Dead-lettered")
    goto(page, console, f"#/queues/%2F/{dlq}")
    page.wait_for_function("document.querySelector('#dl-messages')?.textContent === '4'")
    dead = page.inner_text("#dead-letters")
    assert "rejected" in dead and src in dead, dead

    page.click("button:text-is('Peek 10 messages')")
    page.wait_for_selector("#get-result .payload")
    assert page.locator("#get-result .payload").count() == 4
    eventually("peek leaves them", lambda: depth(ch, dlq) == 4)

    page.click("#redrive-form button[type=submit]")
    flash_ok(page, "Redrive done: 4 moved.")
    eventually("back in the source", lambda: depth(ch, src) == 4 and depth(ch, dlq) == 0)
    bodies = sorted(ch.basic_get(src, auto_ack=True)[2] for _ in range(4))
    assert bodies == [f"job {i}".encode() for i in range(4)]
    page.wait_for_function("document.querySelector('#dl-messages')?.textContent === '0'")
    console.assert_clean()


@pytest.mark.parametrize("hash_", PAGES)
def test_every_page_renders_without_console_errors(page, console, hash_):
    login(page)
    goto(page, console, hash_)
    assert page.inner_text("main h1")
    assert page.inner_text("nav a.active")


def test_exchange_page_binds_and_publishes(page, console, amqp):
    x, q = name("x"), name("bound")
    ch = amqp.channel()
    ch.exchange_declare(x, "topic", durable=True)
    quorum(ch, q)
    login(page)
    goto(page, console, f"#/exchanges/%2F/{x}")
    bind = page.locator("form", has_text="Add binding from this exchange")
    bind.locator("input[name=destination]").fill(q)
    bind.locator("input[name=routing_key]").fill("order.*")
    bind.locator("input[name=routing_key]").press("Enter")
    flash_ok(page, "Binding added.")
    page.locator("table", has_text=q).wait_for()

    pub = page.locator("#publish-form")
    pub.locator("input[name=routing_key]").fill("order.created")
    pub.locator("textarea[name=payload]").fill("via the exchange page")
    pub.locator("button[type=submit]").click()
    flash_ok(page, "Message published.")
    eventually("routed to the bound queue", lambda: depth(ch, q) == 1)
    assert ch.basic_get(q, auto_ack=True)[2] == b"via the exchange page"
    page.evaluate("document.querySelector('#flash').hidden = true")
    pub.locator("input[name=routing_key]").fill("nobody.listens")
    pub.locator("button[type=submit]").click()
    flash_ok(page, "Message published, but not routed.")
    console.assert_clean()


def test_users_vhosts_and_permissions_forms(page, console):
    user, vhost = name("user"), name("vhost")
    login(page)
    goto(page, console, "#/users")
    form = page.locator("form", has_text="Add / update user")
    form.locator("input[name=name]").fill(user)
    form.locator("input[name=password]").fill("secret")
    form.locator("input[name=tags]").fill("monitoring")
    form.locator("input[name=tags]").press("Enter")
    flash_ok(page, f"User {user} saved.")
    assert api("GET", f"/api/users/{user}")[1]["tags"] == ["monitoring"]
    assert api("GET", "/api/whoami", user=user, password="secret")[0] == 200

    goto(page, console, "#/vhosts")
    page.locator("form", has_text="Add a new virtual host").locator("input[name=name]").fill(vhost)
    page.locator("form", has_text="Add a new virtual host").locator("input[name=name]").press("Enter")
    flash_ok(page, f"Virtual host {vhost} added.")
    perm = page.locator("form", has_text="Set permission")
    eventually("the new vhost in the permission form",
               lambda: vhost in perm.locator("select[name=vhost]").inner_text())
    perm.locator("select[name=user]").select_option(user)
    perm.locator("select[name=vhost]").select_option(vhost)
    perm.locator("input[name=write]").fill("^$")
    perm.locator("button[type=submit]").click()
    flash_ok(page, "Permissions set.")
    status, p = api("GET", f"/api/permissions/{vhost}/{user}")
    assert status == 200 and (p["configure"], p["write"], p["read"]) == (".*", "^$", ".*")

    page.locator("tr", has_text=vhost).filter(has_text="running").locator("button:text-is('Delete')").click()
    flash_ok(page, f"Virtual host {vhost} deleted.")
    assert api("GET", f"/api/vhosts/{vhost}")[0] == 404
    goto(page, console, "#/users")
    page.locator("tr", has_text=user).locator("button:text-is('Delete')").click()
    flash_ok(page, f"User {user} deleted.")
    assert api("GET", f"/api/users/{user}")[0] == 404
    console.assert_clean()


def test_a_monitoring_user_reads_every_page_it_may(page, console):
    user = name("mon")
    assert api("PUT", f"/api/users/{user}", {"password": "pw", "tags": "monitoring"})[0] == 201
    try:
        login(page, user, "pw")
        assert page.is_hidden("nav a[href='#/users']")
        for hash_ in ["#/", "#/queues", "#/exchanges", "#/connections", "#/channels", "#/nodes",
                      "#/policies", "#/vhosts"]:
            goto(page, console, hash_)
        assert "shown to administrators" in page.inner_text("main")
    finally:
        api("DELETE", f"/api/users/{user}")


def test_cluster_page_drains_revives_and_rebalances(page, console):
    login(page)
    goto(page, console, "#/nodes")
    row = page.locator("main table tbody tr", has_text="quorumq@1")
    row.wait_for()
    row.locator("button:text-is('Drain')").click()
    flash_ok(page, "Node quorumq@1 drained")

    def drained(want):
        status, nodes = api("GET", "/api/nodes")
        return status == 200 and any(n["name"] == "quorumq@1" and bool(n.get("being_drained")) == want
                                     for n in nodes)

    eventually("the node in maintenance mode", lambda: drained(True))
    row.locator("button:text-is('Revive')").wait_for()
    assert "draining" in row.inner_text()
    row.locator("button:text-is('Revive')").click()
    flash_ok(page, "Node quorumq@1 revived.")
    eventually("the node out of maintenance mode", lambda: drained(False))
    page.click("button:text-is('Rebalance queue leaders')")
    flash_ok(page, "Rebalance started")
    console.assert_clean()
