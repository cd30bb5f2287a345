{{ config(materialized='view') }}
-- Customers whose orders add up to 1000 or more; computed from customer_order_totals on read.
select customer_id, name, email, order_total
from {{ ref('customer_order_totals') }}
where order_total >= 1000
