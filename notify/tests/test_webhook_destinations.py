"""Webhooks go only to global addresses unless an operator allows private ones: a loopback,
private or link-local host is refused when subscribing and again at each try, the name is
resolved once per try and the connection goes to the address that was checked (no DNS
rebinding), and one refused hook costs only its own delivery."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from rest_framework.test import APIClient

from jobs.services.lifecycle import transition
from jobs.statuses import JobStatus
from notify import services
from notify.models import Delivery, Subscription
from notify.worker import worker

SUBSCRIPTIONS = "/api/v1/notifications/subscriptions/"
PUBLIC = "93.184.216.34"  # what the test's resolver says hooks.example.org is


class Receiver:
    """An HTTP endpoint on 127.0.0.1 that records each POST's path and body."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.posts.append((self.path, json.loads(body)))
                self.send_response(204)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def network(monkeypatch, receiver):
    """A resolver that says hooks.example.org is a public address (and, asked again, 127.0.0.1:
    a rebinding name), and a network that routes that public address to the receiver. Records
    every lookup and every address connected to."""
    lookups: list[str] = []
    connected: list[tuple[str, int]] = []
    real_getaddrinfo, real_connect = socket.getaddrinfo, socket.create_connection

    def getaddrinfo(host, port, *args, **kwargs):
        if host in ("hooks.example.org", "rebinding.example.org"):
            lookups.append(host)
            answer = PUBLIC if host == "hooks.example.org" or len(lookups) == 1 else "127.0.0.1"
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answer, port))]
        if host == "intranet.example.org":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (PUBLIC, port)), (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", port))]
        return real_getaddrinfo(host, port, *args, **kwargs)

    def create_connection(address, *args, **kwargs):
        connected.append(address)
        if address[0] == PUBLIC:
            return real_connect(("127.0.0.1", receiver.port), *args, **kwargs)
        return real_connect(address, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    return {"lookups": lookups, "connected": connected}


def api_as(user) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url, said",
    [
        ("http://127.0.0.1:8000/hook", "127.0.0.1 is a loopback or private address"),
        ("http://localhost:8000/hook", "a loopback or private address"),
        ("http://[::1]:8000/hook", "::1 is a loopback or private address"),
        ("http://[::ffff:127.0.0.1]/hook", "a loopback or private address"),
        ("http://10.0.0.7/hook", "10.0.0.7 is a loopback or private address"),
        ("http://192.168.1.1/hook", "a loopback or private address"),
        ("http://100.64.0.1/hook", "a loopback or private address"),
        ("http://169.254.169.254/latest/meta-data/", "a link-local, multicast, unspecified or reserved address"),
        ("http://0.0.0.0/hook", "a link-local, multicast, unspecified or reserved address"),
        ("http://224.0.0.1/hook", "a link-local, multicast, unspecified or reserved address"),
        ("http://240.0.0.1/hook", "a link-local, multicast, unspecified or reserved address"),
    ],
)
def test_a_webhook_to_a_local_address_is_refused_when_subscribing(owner, url, said):
    answer = api_as(owner).post(SUBSCRIPTIONS, {"channel": "webhook", "url": url}, format="json")

    assert answer.status_code == 400
    assert said in answer.json()["url"][0], answer.json()
    assert not Subscription.objects.exists()


@pytest.mark.django_db
@pytest.mark.slow  # an HTTP receiver on loopback, on a thread
def test_a_name_with_one_private_address_among_public_ones_is_refused(owner, network):
    answer = api_as(owner).post(SUBSCRIPTIONS, {"channel": "webhook", "url": "https://intranet.example.org/hook"}, format="json")

    assert answer.status_code == 400
    assert answer.json()["url"] == [
        "This URL cannot receive webhooks: intranet.example.org resolves to 10.1.2.3, is a loopback or private address (NOTIFY_WEBHOOK_ALLOW_PRIVATE is off)."
    ]


@pytest.mark.django_db
def test_the_page_shows_the_refusal_beside_the_form(client, owner):
    client.force_login(owner)

    page = client.post("/account/notifications/", {"channel": "webhook", "url": "http://127.0.0.1:9/hook", "scope": "mine"})

    assert page.status_code == 200 and "127.0.0.1 is a loopback or private address" in page.content.decode()
    assert not Subscription.objects.exists()


@pytest.mark.django_db
def test_an_operator_may_allow_private_webhooks(owner, settings):
    settings.NOTIFY_WEBHOOK_ALLOW_PRIVATE = True

    answer = api_as(owner).post(SUBSCRIPTIONS, {"channel": "webhook", "url": "http://127.0.0.1:9/hook"}, format="json")
    assert answer.status_code == 201
    # Link-local (cloud metadata) stays refused even then.
    answer = api_as(owner).post(SUBSCRIPTIONS, {"channel": "webhook", "url": "http://169.254.169.254/"}, format="json")
    assert answer.status_code == 400 and "link-local" in answer.json()["url"][0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow  # an HTTP receiver on loopback, on a thread
def test_a_hook_that_turned_local_fails_at_its_try_and_another_users_hook_is_delivered(make_job, owner, outsider, network, receiver):
    mine, theirs = make_job(), make_job(owner=outsider, name="theirs")
    # Made while an operator allowed it (or straight in the database): checked again at the try.
    local = Subscription.objects.create(user=owner, channel="webhook", url=f"http://127.0.0.1:{receiver.port}/local/", job=mine)
    public = api_as(outsider).post(SUBSCRIPTIONS, {"channel": "webhook", "url": "http://hooks.example.org/public/"}, format="json")
    assert public.status_code == 201, public.json()
    for job in (mine, theirs):
        for status in (JobStatus.RUNNING, JobStatus.COMPLETED):
            assert transition(job.pk, status, reason="test")  # while the worker delivers the last ones
    assert worker.idle()

    refused = Delivery.objects.get(subscription=local)
    assert (refused.state, refused.attempts) == ("failed", 1)  # final: not retried
    assert "127.0.0.1 is a loopback or private address" in refused.last_error
    assert Delivery.objects.get(subscription_id=public.json()["id"]).state == "delivered"
    assert [(path, body["job"]["name"], body["status"]) for path, body in receiver.posts] == [("/public/", "theirs", "Completed")]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow  # an HTTP receiver on loopback, on a thread
def test_the_try_connects_to_the_address_it_checked(make_job, owner, network, receiver):
    job = make_job()
    hook = api_as(owner).post(SUBSCRIPTIONS, {"channel": "webhook", "url": "http://rebinding.example.org:8080/hook"}, format="json")
    assert hook.status_code == 201, hook.json()
    network["lookups"].clear()  # the subscription's own check; the try's lookup says public once, then loopback
    for status in (JobStatus.RUNNING, JobStatus.COMPLETED):
        assert transition(job.pk, status, reason="test")
    assert worker.idle()

    assert Delivery.objects.get().state == "delivered"
    assert network["lookups"] == ["rebinding.example.org"]  # resolved once for the try
    assert network["connected"] == [(PUBLIC, 8080)]  # and connected to that answer, not to a second one
    assert [path for path, _ in receiver.posts] == ["/hook"]


@pytest.mark.slow  # an HTTP receiver on loopback, on a thread
def test_check_destination_returns_every_checked_address(network):
    assert services.check_destination("https://hooks.example.org/x") == [PUBLIC]
    with pytest.raises(services.DeliveryError, match="not an http"):
        services.check_destination("file:///etc/passwd")
    with pytest.raises(services.DeliveryError, match="port"):
        services.check_destination("http://hooks.example.org:99999/")
