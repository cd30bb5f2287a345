{{ config(materialized='table') }}
-- One row per live customer: how many orders they placed and for how much.
select
    c.id as customer_id,
    c.name,
    c.email,
    count(o.order_id) as orders,
    coalesce(sum(o.amount), 0) as order_total,
    max(o.order_date) as last_order_date
from {{ source('shop', 'customers') }} c
left join {{ ref('orders') }} o on o.customer_id = c.id
group by c.id, c.name, c.email
