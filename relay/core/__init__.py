"""What every stage shares and nothing of relay's below: the values a webhook
becomes (`payload`: its body, headers and query; `canonical`: its digest;
`outcome`: what an attempt came to) and the rules read everywhere (time in
`clock` and `localtime`, durations and sizes in `units`, CPU budgets in
`budget`, masking in `secrets`, PostgreSQL URLs in `pgurl`)."""
