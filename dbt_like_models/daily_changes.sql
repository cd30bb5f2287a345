{{ config(materialized='table', partition_by='change_date') }}
-- Changed rows per source table and day (of the change at the source), from the change logs.
with changes as (
    select 'shop.customers' as table_name, op, event_time
    from {{ source('shop', 'customers', layer='changelog') }}
    union all
    select 'shop.orders', op, event_time
    from {{ source('shop', 'orders', layer='changelog') }}
    union all
    select 'lindorm.users', op, event_time
    from {{ source('lindorm', 'users', layer='changelog') }}
)
select
    to_date(event_time) as change_date,
    table_name,
    count_if(op in ('c', 'r')) as inserted,
    count_if(op = 'u') as updated,
    count_if(op = 'd') as deleted,
    count_if(op = 't') as truncated,
    count(*) as changed_rows
from changes
group by to_date(event_time), table_name
