"""The outbound HTTP library every HTTP-style target builds on (http,
telegram): two layers, as httpx draws them.

    a target kind        builds a transport.Request, judges an answer
      └─ policy          exchange(): header rules, redirects, classify, Retry-After
           └─ transport  Transport.send: one request, one bounded Answer
                ├─ client           relay's own HTTP/1.1 client (the default)
                └─ aiohttp_client   aiohttp's client, `transport = "aiohttp"`

connections holds the keys that say how connections are made (proxy, TLS,
transport) and opens the transport a target sends through, the one place a
transport is chosen. What the client will never do is written in
docs/develop.md ("The outbound client's scope").
"""
