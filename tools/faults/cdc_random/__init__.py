"""The randomized CDC campaign: tables drawn from a seed, copied while writers change them,
faults on the way, the copy compared with the table value by value. Run by the suite
(tests/integration/test_cdc_random.py, a short run) and by ``scripts/chaos --kinds
cdc-random`` (a long one)."""
