"""Ingress: the public listener (`listener`) takes a webhook, has it stored,
then answers 200. Below it: relay's own HTTP/1.1 server (`http1`, its refusals
logged by `httplog`), connection caps (`guard`), bodies inflated within a bound
(`encoding`), who is sending (`netaddr`), and one webhook before it is stored
(`incoming`: parsed once, keyed by `keys`, planned)."""
